//! AVX2 twin of the neighbour pick of `dither::dq_encode_dithered`, eight
//! blocks a vector: the two table entries of each code by gather, the
//! splitmix64 numbers four 64-bit lanes a register (AVX2 has no 64-bit
//! multiply: each product is built from three 32 x 32 -> 64-bit ones, the
//! low 64 bits of the full product, as `u64::wrapping_mul`), the same
//! comparisons as the scalar loop, so the same codes and decoded scales bit
//! for bit. The scalar loop, a 64-bit hash and two dependent loads per
//! block, was about 6 % of the step's time on Zen 3.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use crate::scales::coin::Dither;
use crate::simd::Avx2;

/// Blocks per iteration.
const LANES: usize = 8;

/// Move each of the first `orig.len() / 8 * 8` blocks of `codes` (the
/// rounded-up codes of the scales `orig` over the group table `t`) one code
/// down with the dither's probability, writing the decoded scale of every
/// moved block to `dec`. Returns how many blocks it handled; the caller
/// picks the rest with the scalar loop.
pub(super) fn pick(
    _proof: Avx2,
    orig: &[f32],
    t: &[f32; 256],
    codes: &mut [u8],
    dec: &mut [f32],
    d: Dither,
) -> usize {
    assert!(codes.len() == orig.len() && dec.len() == orig.len());
    let whole = orig.len() / LANES * LANES;
    // SAFETY: the token proves AVX2 and FMA; the body loads and stores
    // lanes `i..i + 8` with `i + 8 <= whole <= len` of the three slices (of
    // equal length, asserted) and gathers with indices in 0..=255, inside `t`.
    unsafe { pick_impl(&orig[..whole], t, codes, dec, d) };
    whole
}

/// The low 64 bits of `a * b` in each 64-bit lane, for a constant `b`
/// given as its low and high halves (each in the low 32 bits of a lane).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn mul64(a: __m256i, b_lo: __m256i, b_hi: __m256i) -> __m256i {
    // SAFETY: AVX2 per this function's contract; register operations only.
    unsafe {
        let lo = _mm256_mul_epu32(a, b_lo);
        let cross = _mm256_add_epi64(
            _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), b_lo),
            _mm256_mul_epu32(a, b_hi),
        );
        _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(cross))
    }
}

/// splitmix64's finalizer (`crate::scales::coin::splitmix64`) on four
/// 64-bit lanes, shifted right by 40: the 24-bit numbers of
/// `Dither::uniform`, in the low 32 bits of each lane.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn splitmix64_top24(z: __m256i) -> __m256i {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    const M1: u64 = 0xBF58_476D_1CE4_E5B9;
    const M2: u64 = 0x94D0_49BB_1331_11EB;
    // SAFETY: AVX2 per this function's contract; register operations only.
    unsafe {
        let half = |m: u64| {
            (
                _mm256_set1_epi64x((m & 0xFFFF_FFFF) as i64),
                _mm256_set1_epi64x((m >> 32) as i64),
            )
        };
        let ((m1_lo, m1_hi), (m2_lo, m2_hi)) = (half(M1), half(M2));
        let z = _mm256_add_epi64(z, _mm256_set1_epi64x(GOLDEN as i64));
        let z = mul64(
            _mm256_xor_si256(z, _mm256_srli_epi64::<30>(z)),
            m1_lo,
            m1_hi,
        );
        let z = mul64(
            _mm256_xor_si256(z, _mm256_srli_epi64::<27>(z)),
            m2_lo,
            m2_hi,
        );
        // (z ^ (z >> 31)) >> 40 keeps bits 40..63 of z ^ (z >> 31), which
        // are z's bits 40..63 xor its bits 71..: those are 0, so z >> 40.
        _mm256_srli_epi64::<40>(z)
    }
}

/// The uniform numbers of blocks `i..i + 8` (`Dither::uniform`).
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn uniforms(d: Dither, i: usize) -> __m256 {
    // SAFETY: AVX2 per this function's contract; register operations only.
    unsafe {
        let base = d.first_block.wrapping_add(i as u64);
        let idx = |k: u64| {
            _mm256_set_epi64x(
                base.wrapping_add(k + 3) as i64,
                base.wrapping_add(k + 2) as i64,
                base.wrapping_add(k + 1) as i64,
                base.wrapping_add(k) as i64,
            )
        };
        let key = _mm256_set1_epi64x(d.key as i64);
        let a = splitmix64_top24(_mm256_xor_si256(key, idx(0)));
        let b = splitmix64_top24(_mm256_xor_si256(key, idx(4)));
        // The low 32 bits of each 64-bit lane, in block order: per 128-bit
        // half [a0 a1 b0 b1 | a2 a3 b2 b3], then the 64-bit pairs reordered.
        let packed = _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(
            _mm256_castsi256_ps(a),
            _mm256_castsi256_ps(b),
        ));
        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
        // 24-bit integers convert exactly; the scale is a power of two.
        _mm256_mul_ps(
            _mm256_cvtepi32_ps(ordered),
            _mm256_set1_ps(1.0 / 16_777_216.0),
        )
    }
}

/// # Safety
/// AVX2; `orig.len()` a multiple of 8, `codes` and `dec` at least as long.
#[target_feature(enable = "avx2,fma")]
unsafe fn pick_impl(orig: &[f32], t: &[f32; 256], codes: &mut [u8], dec: &mut [f32], d: Dither) {
    let (one, last, top) = (
        _mm256_set1_epi32(1),
        _mm256_set1_epi32(254),
        _mm256_set1_epi32(255),
    );
    // Byte 0 of each 32-bit lane to the low 4 bytes of each 128-bit half.
    let low_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    for i in (0..orig.len()).step_by(LANES) {
        // SAFETY: `i + 8 <= orig.len() <= codes.len(), dec.len()` (this
        // function's contract); gather indices are codes (0..=255) or
        // `min(code + 1, 255)`, inside `t`; the features are enabled here.
        unsafe {
            let x = _mm256_loadu_ps(orig.as_ptr().add(i));
            let code =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.as_ptr().add(i) as *const __m128i));
            let hi = _mm256_i32gather_ps::<4>(t.as_ptr(), code);
            let next = _mm256_min_epi32(_mm256_add_epi32(code, one), top);
            let lo = _mm256_i32gather_ps::<4>(t.as_ptr(), next);
            let gap = _mm256_sub_ps(hi, lo);
            let u = uniforms(d, i);
            // The scalar `(k < 254) & (gap > 0) & (u * gap < hi - x)`.
            let down = _mm256_and_si256(
                _mm256_cmpgt_epi32(last, code),
                _mm256_castps_si256(_mm256_and_ps(
                    _mm256_cmp_ps::<_CMP_GT_OQ>(gap, _mm256_setzero_ps()),
                    _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_mul_ps(u, gap), _mm256_sub_ps(hi, x)),
                )),
            );
            // `down` is -1 in a moved lane: subtracting it adds one.
            let moved = _mm256_sub_epi32(code, down);
            let bytes = _mm256_shuffle_epi8(moved, low_bytes);
            let eight = _mm_unpacklo_epi32(
                _mm256_castsi256_si128(bytes),
                _mm256_extracti128_si256::<1>(bytes),
            );
            _mm_storel_epi64(codes.as_mut_ptr().add(i) as *mut __m128i, eight);
            let old = _mm256_loadu_ps(dec.as_ptr().add(i));
            let new = _mm256_blendv_ps(old, lo, _mm256_castsi256_ps(down));
            _mm256_storeu_ps(dec.as_mut_ptr().add(i), new);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_the_scalar_numbers() {
        let Some(_tok) = Avx2::new() else {
            eprintln!("skipped: no AVX2 in force");
            return;
        };
        for (t, numel, first) in [(1, 1, 0), (7, 1000, 256), (u64::MAX, 3, u64::MAX - 5)] {
            let d = Dither::new(t, numel, first);
            for i in [0usize, 8, 248] {
                let mut got = [0f32; 8];
                // SAFETY: the token above proves AVX2; a store to a local
                // array of 8 floats.
                unsafe { _mm256_storeu_ps(got.as_mut_ptr(), uniforms(d, i)) };
                let want: Vec<f32> = (0..8).map(|k| d.uniform(i + k)).collect();
                assert_eq!(&got[..], &want[..], "{t} {numel} {first} {i}");
            }
        }
    }
}
