//! W8A8's activation rounding, `dec(encode_e4m3(x / s_a, saturate))`,
//! computed in float32 without the codes in between.
//!
//! Why: the codec's encode-then-decode (`crate::fp8::round_to_grid_slice`)
//! decodes through a table gather, and the two passes took ~0.45 ms of a
//! 512 x 576 -> 192 W8A8 prefill call on Zen 3 (the call ~3 ms); here the
//! value is rounded where it lies. E4M3 facts (OCP 8-bit floating point):
//! 3 mantissa bits, normals from 2^-6, subnormals the multiples of 2^-9
//! below it, largest finite 448; round to nearest, ties to even.
//!
//! - `|v| >= 2^-6`: the float32 bits plus `0x7FFFF` plus bit 20 (the last
//!   kept mantissa bit), with the low 20 bits cleared, is `|v|` rounded to
//!   3 mantissa bits, ties to even (a carry moves into the exponent, as it
//!   should);
//! - `|v| < 2^-6`: `(|v| + 2^14) - 2^14` in float32 rounds to a multiple of
//!   2^-9 (the spacing of float32 at 2^14), ties to even, by the FPU itself;
//! - then `min(448, r)`: saturation (infinities included); the sign is put
//!   back; NaN stays NaN (its payload is not canonicalized: only NaN-ness
//!   matters to the dot products that read these values).
//!
//! Equal bit for bit to the codec's rounding on every non-NaN float32 (the
//! tests compare the two).

const MAX: f32 = 448.0;
/// `2^-6`, E4M3's smallest normal.
const MIN_NORMAL: f32 = 0.015625;
/// `2^14`: float32's spacing from here up is 2^-9, E4M3's subnormal step.
const SUB_MAGIC: f32 = 16384.0;

/// `v` rounded onto the E4M3 grid with saturation (see the module docs).
pub(crate) fn round_e4m3_sat(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs();
    let r = if a < MIN_NORMAL {
        // Two roundings to float32 of which the first is the wanted one
        // and the second exact: `std::hint::black_box` keeps the compiler
        // from folding them (it may not anyway; IEEE semantics).
        std::hint::black_box(a + SUB_MAGIC) - SUB_MAGIC
    } else {
        let b = a.to_bits();
        f32::from_bits((b + 0x7FFFF + ((b >> 20) & 1)) & 0xFFF0_0000)
    };
    MAX.min(r).copysign(v)
}

/// `dst[i] = round_e4m3_sat(src[i] / a)` (a true division), the SIMD body
/// where the level has one.
pub(crate) fn div_round_e4m3(src: &[f32], a: f32, dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = crate::simd::Avx2::new() {
        // SAFETY: the token proves AVX2.
        unsafe { avx2::div_round_e4m3(t, src, a, dst) };
        return;
    }
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = round_e4m3_sat(v / a);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{round_e4m3_sat, MAX, MIN_NORMAL, SUB_MAGIC};
    use crate::simd::Avx2;

    /// Eight lanes at a time of [`super::div_round_e4m3`], the tail by the
    /// scalar twin.
    ///
    /// # Safety
    /// None beyond the token: it proves AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn div_round_e4m3(_: Avx2, src: &[f32], a: f32, dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let n = src.len() / 8 * 8;
        let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
        let av = _mm256_set1_ps(a);
        let sign = _mm256_set1_ps(-0.0);
        let half = _mm256_set1_epi32(0x7FFFF);
        let one = _mm256_set1_epi32(1);
        let keep = _mm256_set1_epi32(0xFFF0_0000u32 as i32);
        let (max, min_normal, magic) = (
            _mm256_set1_ps(MAX),
            _mm256_set1_ps(MIN_NORMAL),
            _mm256_set1_ps(SUB_MAGIC),
        );
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 <= n <= src.len() == dst.len().
            unsafe {
                let v = _mm256_div_ps(_mm256_loadu_ps(ps.add(i)), av);
                let s = _mm256_and_ps(v, sign);
                let m = _mm256_andnot_ps(sign, v);
                let b = _mm256_castps_si256(m);
                let lsb = _mm256_and_si256(_mm256_srli_epi32::<20>(b), one);
                let rn = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(b, half), lsb), keep);
                let rs = _mm256_sub_ps(_mm256_add_ps(m, magic), magic);
                let small = _mm256_cmp_ps::<_CMP_LT_OQ>(m, min_normal);
                let r = _mm256_blendv_ps(_mm256_castsi256_ps(rn), rs, small);
                // min(448, r): r where r is NaN (the second operand).
                let r = _mm256_or_ps(_mm256_min_ps(max, r), s);
                // NaN lanes keep v (the rounding above may have made one an
                // infinity, then 448).
                let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
                _mm256_storeu_ps(pd.add(i), _mm256_blendv_ps(r, v, nan));
            }
            i += 8;
        }
        for j in n..src.len() {
            dst[j] = round_e4m3_sat(src[j] / a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::{round_to_grid_slice, Fp8Format};

    fn reference(v: &[f32]) -> Vec<f32> {
        let mut r = v.to_vec();
        round_to_grid_slice(&mut r, Fp8Format::E4M3, true);
        r
    }

    fn same(got: &[f32], want: &[f32], what: &str) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{what}: element {i}: {g:e} ({:#x}) vs {w:e} ({:#x})",
                g.to_bits(),
                w.to_bits()
            );
        }
    }

    /// Float32 patterns that cover every E4M3 binade: a stride through
    /// all 2^32 patterns, every E4M3 value and the float32 neighbours of
    /// every midpoint between two of them (the ties, where the rule shows),
    /// zeros, subnormals, infinities, NaNs, the overflow range.
    fn patterns() -> Vec<f32> {
        let mut v: Vec<f32> = (0..1u64 << 32)
            .step_by(4093)
            .map(|b| f32::from_bits(b as u32))
            .collect();
        let table = crate::fp8::decode_table(Fp8Format::E4M3);
        let mut grid: Vec<f32> = table
            .iter()
            .copied()
            .filter(|g| g.is_finite() && *g >= 0.0)
            .collect();
        grid.sort_by(f32::total_cmp);
        grid.push(480.0);
        for w in grid.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            for d in -3i32..=3 {
                let b = (mid.to_bits() as i32 + d) as u32;
                v.extend([f32::from_bits(b), -f32::from_bits(b)]);
            }
            v.extend([w[0], -w[0]]);
        }
        v.extend([
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            464.0,
            463.99997,
            500.0,
            f32::MAX,
        ]);
        v
    }

    #[test]
    fn scalar_matches_the_codec_round_trip() {
        let v = patterns();
        let got: Vec<f32> = v.iter().map(|&x| round_e4m3_sat(x)).collect();
        same(&got, &reference(&v), "scalar");
    }

    /// The dispatched body (AVX2 where the CPU has it) with a division by
    /// 1, by a power of two (exact) and by 0.37 (rounded), against the
    /// codec's rounding of the same quotients; lengths with tails.
    #[test]
    fn dispatched_matches_the_codec_round_trip() {
        let v = patterns();
        for a in [1.0f32, 0.25, 0.37] {
            for len in [v.len(), 13, 7] {
                let src = &v[..len];
                let q: Vec<f32> = src.iter().map(|x| x / a).collect();
                let mut got = vec![0f32; len];
                div_round_e4m3(src, a, &mut got);
                same(&got, &reference(&q), &format!("a {a} len {len}"));
            }
        }
    }

    #[test]
    fn by_hand() {
        assert_eq!(round_e4m3_sat(1.0625), 1.0); // tie, to even
        assert_eq!(round_e4m3_sat(1.1875), 1.25); // tie, to even (odd below)
        assert_eq!(round_e4m3_sat(3.0 * 2f32.powi(-10)), 2.0 * 2f32.powi(-9)); // subnormal tie
        assert_eq!(round_e4m3_sat(1000.0), 448.0);
        assert_eq!(round_e4m3_sat(f32::NEG_INFINITY), -448.0);
        assert!(round_e4m3_sat(-0.0).is_sign_negative());
        assert!(round_e4m3_sat(f32::NAN).is_nan());
    }
}
