//! Deterministic test data for the optimizer's unit tests.

/// `n` values in `[-scale, scale)` from a xorshift64 stream keyed by `seed`
/// (deterministic, no dependency).
pub(crate) fn xorshift_f32(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}
