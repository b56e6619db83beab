//! Unbiased rounding of v's double-quantized block scales (state format 2).
//!
//! Format 1 rounded every block scale *up* to the next code of its group's
//! log grid. v decays by at most a factor `b2` per step (0.1 %, 0.05 % in
//! `sqrt(v)`), far less than one grid step (typically 1-5 %), so a block
//! scale rounded up stays on the same code while v decays and moves up
//! whenever v grows: a ratchet that keeps v above float32 AdamW's and the
//! steps too small, most visibly late in training
//! (docs/optim-convergence.md).
//!
//! Format 2 rounds v's scale `x` to one of its two neighbouring codes,
//! `t[c] >= x >= t[c + 1]`, down with probability
//! `(t[c] - x) / (t[c] - t[c + 1])`, so the decoded scale equals `x` in
//! expectation and small decays accumulate. The random number is a hash of
//! the step, the parameter's size and the block index (no state, the same on
//! every thread count and SIMD level). A block scale rounded down leaves its
//! largest element slightly above 1 after normalization; the element code
//! book saturates it at its top code. m's scales keep rounding up (m follows
//! the gradient within a few steps, so no ratchet forms).

use super::dispatch::Kernels;
use super::format::GROUP_BLOCKS;
#[cfg(test)]
use crate::scales::coin::splitmix64;
pub(crate) use crate::scales::coin::Dither;

/// Encode the scales `s` of one group like `ScaleCodec::encode`,
/// then move each block to the next smaller code with the probability that
/// makes its decoded scale unbiased. `s` receives the decoded scales.
/// The pick is the scalar loop or its AVX-512 / AVX2 twin, the same
/// comparisons, so every level gives the same codes.
pub(crate) fn dq_encode_dithered(
    kernels: &Kernels,
    s: &mut [f32],
    codes: &mut [u8],
    d: Dither,
) -> (f32, f32) {
    let n = s.len();
    let mut orig = [0f32; GROUP_BLOCKS];
    orig[..n].copy_from_slice(s);
    let mut t = [0f32; 256];
    let pair = kernels.scales().encode_table(s, codes, &mut t);
    #[cfg(target_arch = "x86_64")]
    if let Some(tok) = kernels.avx512_dq() {
        super::dither_avx512::pick(tok, &orig[..n], &t, codes, s, d);
        return pair;
    }
    // Blocks already picked by the AVX2 twin (eight a vector).
    #[cfg(target_arch = "x86_64")]
    let done = match kernels.avx2() {
        Some(tok) => super::dither_avx2::pick(tok, &orig[..n], &t, codes, s, d),
        None => 0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (i, (&x, (c, dec))) in orig[..n]
        .iter()
        .zip(codes.iter_mut().zip(s.iter_mut()))
        .enumerate()
        .skip(done)
    {
        let k = *c as usize;
        // Code 254 is the group's smallest scale, 255 an all-zero block:
        // neither moves. The coin is fair, so a branch on it mispredicts
        // half the time: the choice is computed without one.
        let (hi, lo) = (t[k], t[(k + 1).min(255)]);
        let gap = hi - lo;
        let down = (k < 254) & (gap > 0.0) & (d.uniform(i) * gap < hi - x);
        *c = (k + down as usize) as u8;
        // A bit select (an `if` here compiles back to the branch).
        let keep = (down as u32).wrapping_sub(1);
        *dec = f32::from_bits((dec.to_bits() & keep) | (lo.to_bits() & !keep));
    }
    pair
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scales::scalar_table;

    fn spread_scales(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                if (i as u32 + seed).is_multiple_of(29) {
                    0.0
                } else {
                    1e-5 * 1.0713f32.powi(((i as u32 * 37 + seed) % 200) as i32)
                }
            })
            .collect()
    }

    #[test]
    fn codes_are_a_neighbour_and_unbiased() {
        // Over many steps, the mean decoded scale of each block approaches
        // its true value; each draw is one of the two neighbouring codes.
        let orig = spread_scales(256, 3);
        let mut sum = vec![0f64; 256];
        let steps = 4000;
        for t in 1..=steps {
            let mut s = orig.clone();
            let mut codes = vec![0u8; 256];
            let k = Kernels::scalar();
            let (max, step) = dq_encode_dithered(&k, &mut s, &mut codes, Dither::new(t, 999, 0));
            let tab = scalar_table(max, step);
            let mut dec = vec![0f32; 256];
            k.scales().decode(&codes, max, step, &mut dec);
            assert_eq!(dec, s);
            for (i, (&x, &c)) in orig.iter().zip(&codes).enumerate() {
                if x == 0.0 {
                    assert_eq!(c, 255);
                    continue;
                }
                let up = (0..255).filter(|&k| tab[k] >= x).max().unwrap();
                assert!(c as usize == up || c as usize == up + 1, "{i}");
                sum[i] += s[i] as f64;
            }
        }
        for (i, &x) in orig.iter().enumerate() {
            if x > 0.0 {
                let mean = sum[i] / steps as f64;
                // One grid step is 1.9 % here; 4000 draws average to ~0.05 %.
                assert!((mean / x as f64 - 1.0).abs() < 3e-3, "{i}: {mean} vs {x}");
            }
        }
    }

    #[test]
    fn every_level_gives_the_same_codes() {
        for n in [256usize, 255, 17, 3] {
            let mut outs = Vec::new();
            for level in crate::simd::available_levels() {
                let k = Kernels::at(level).unwrap();
                let mut s = spread_scales(n, 7);
                let mut codes = vec![0u8; n];
                let pair = dq_encode_dithered(
                    &k,
                    &mut s,
                    &mut codes,
                    Dither::new(5, 77, 2 * GROUP_BLOCKS as u64),
                );
                outs.push((pair, codes, s));
            }
            assert!(outs.windows(2).all(|w| w[0] == w[1]), "{n}");
        }
    }

    #[test]
    fn exact_codes_and_constant_groups_stay() {
        let mut s = vec![3.5f32; 10];
        let mut codes = vec![0u8; 10];
        let pair = dq_encode_dithered(&Kernels::scalar(), &mut s, &mut codes, Dither::new(1, 1, 0));
        assert_eq!(pair, (3.5, 0.0));
        // A one-value grid (step 0) has no smaller neighbour to move to.
        assert!(s.iter().all(|&x| x == 3.5));
        let mut z = vec![0f32; 4];
        let mut c = vec![0u8; 4];
        dq_encode_dithered(&Kernels::scalar(), &mut z, &mut c, Dither::new(1, 1, 0));
        assert!(c.iter().all(|&x| x == 255) && z.iter().all(|&x| x == 0.0));
    }

    #[test]
    fn uniform_matches_the_documented_hash() {
        // The NumPy oracle (python/quantrs/reference/optim.py) computes the
        // same numbers; these pin the definition.
        let d = Dither::new(7, 1000, GROUP_BLOCKS as u64);
        let key = splitmix64(7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 1000);
        let z = splitmix64(key ^ 259);
        assert_eq!(d.uniform(3), (z >> 40) as f32 / 16_777_216.0);
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }
}
