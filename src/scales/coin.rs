//! The random numbers of the unbiased rounding of v's block scales
//! (`crate::optim::dither` says why): a hash of the step, the parameter's
//! size and the block index, with no state, so every thread count, SIMD
//! level and sharding of the parameter draws the same number for a block.

/// splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable
/// pseudorandom number generators", 2014).
#[inline]
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a group's random numbers come from: step `t` (1-based), the
/// parameter's element count, and the index of the group's first block
/// (global: in the row layout of a sharded parameter, counted over the
/// whole parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dither {
    /// `splitmix64(t * golden ^ numel)`.
    pub(crate) key: u64,
    pub(crate) first_block: u64,
}

impl Dither {
    pub(crate) fn new(t: u64, numel: u64, first_block: u64) -> Dither {
        Dither {
            key: splitmix64(t.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ numel),
            first_block,
        }
    }

    /// A uniform number in `[0, 1)` (24 bits) for block `i` of the group.
    #[inline]
    pub(crate) fn uniform(&self, i: usize) -> f32 {
        let z = splitmix64(self.key ^ self.first_block.wrapping_add(i as u64));
        (z >> 40) as f32 * (1.0 / 16_777_216.0)
    }
}
