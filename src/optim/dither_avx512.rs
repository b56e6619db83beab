//! AVX-512 twin of the neighbour pick of `dither::dq_encode_dithered`,
//! 16 blocks a vector: the two table entries of each code by gather, the
//! splitmix64 numbers eight 64-bit lanes at a time (`vpmullq`, AVX-512
//! DQ), the same comparisons as the scalar loop, so the same codes and
//! decoded scales bit for bit. The scalar loop cost about a tenth of the
//! step (a 64-bit hash and two dependent loads per block).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use crate::scales::coin::Dither;
use crate::scales::dither_uniforms_avx512;
use crate::simd::Avx512Dq;

/// Move each block of `codes` (the rounded-up codes of the scales `orig`
/// over the group table `t`) one code down with the dither's probability,
/// writing the decoded scale of every moved block to `dec`.
pub(super) fn pick(
    _proof: Avx512Dq,
    orig: &[f32],
    t: &[f32; 256],
    codes: &mut [u8],
    dec: &mut [f32],
    d: Dither,
) {
    assert!(codes.len() == orig.len() && dec.len() == orig.len());
    // SAFETY: the token proves AVX-512 F/BW/VL and DQ; the body masks every
    // load and store to `0..orig.len()` (the three lengths are equal) and
    // gathers with indices in 0..=255, inside `t`.
    unsafe { pick_impl(orig, t, codes, dec, d) }
}

/// # Safety
/// AVX-512 F/BW/VL and DQ; `codes` and `dec` as long as `orig`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn pick_impl(orig: &[f32], t: &[f32; 256], codes: &mut [u8], dec: &mut [f32], d: Dither) {
    let n = orig.len();
    let (one, last, top) = (
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(254),
        _mm512_set1_epi32(255),
    );
    for i in (0..n).step_by(16) {
        let left = n - i;
        let k: __mmask16 = if left >= 16 {
            0xffff
        } else {
            (1u16 << left) - 1
        };
        // SAFETY: the loads and stores are masked to the lanes `i..n`, inside
        // the three slices; gather indices are codes (0..=255) or
        // `min(code + 1, 255)`, inside `t`; the features are enabled here.
        unsafe {
            let x = _mm512_maskz_loadu_ps(k, orig.as_ptr().add(i));
            let code =
                _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, codes.as_ptr().add(i) as *const i8));
            let hi = _mm512_i32gather_ps::<4>(code, t.as_ptr());
            let next = _mm512_min_epi32(_mm512_add_epi32(code, one), top);
            let lo = _mm512_i32gather_ps::<4>(next, t.as_ptr());
            let gap = _mm512_sub_ps(hi, lo);
            let u = dither_uniforms_avx512(d, i);
            // The scalar `(k < 254) & (gap > 0) & (u * gap < hi - x)`.
            let down = k
                & _mm512_cmp_epi32_mask::<_MM_CMPINT_LT>(code, last)
                & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(gap, _mm512_setzero_ps())
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_mul_ps(u, gap), _mm512_sub_ps(hi, x));
            let moved = _mm512_mask_add_epi32(code, down, code, one);
            _mm512_mask_cvtepi32_storeu_epi8(codes.as_mut_ptr().add(i) as *mut i8, k, moved);
            _mm512_mask_storeu_ps(dec.as_mut_ptr().add(i), down, lo);
        }
    }
}
