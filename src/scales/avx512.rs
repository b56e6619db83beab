//! AVX-512 twins of the table and the code search of `scalar.rs`. Each
//! `unsafe fn` here is private; the `pub(super)` wrappers take an
//! [`Avx512`] token, the proof that the CPU runs them.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::scalar::{encode_one, GroupTable, EXP2_C};
use crate::simd::Avx512;

/// Block-scale codes of double quantization, 16 blocks at a time: a guess
/// from a vectorized logarithm (`getexp` + `getmant` + the atanh series),
/// verified with two gathers (`t[c] >= x > t[c + 1]`); lanes that fail, and
/// zero scales, go through the scalar walk. The code of a scale is defined
/// by the table alone (the largest `c` with `t[c] >= x`), so this returns
/// exactly the scalar codes. Returns how many leading entries it handled
/// (a `scalar::PrefixSearch`).
pub(super) fn dq_search(_proof: Avx512, s: &mut [f32], codes: &mut [u8], g: &GroupTable) -> usize {
    // SAFETY: the token proves AVX-512 F/BW/VL; `dq_search_impl` bounds its
    // accesses by `min(s.len(), codes.len())` and clamps gather indices.
    unsafe { dq_search_impl(s, codes, g.max, g.inv_step, g.t) }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL. (For the codes to be right, `t`
/// must be non-increasing with `t[0] = max` and `t[255] = 0`.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn dq_search_impl(
    s: &mut [f32],
    codes: &mut [u8],
    max: f32,
    inv_step: f32,
    t: &[f32; 256],
) -> usize {
    let n = s.len().min(codes.len());
    let (inv_max, istep) = (_mm512_set1_ps(1.0 / max), _mm512_set1_ps(inv_step));
    let one = _mm512_set1_ps(1.0);
    let two_over_ln2 = _mm512_set1_ps(2.0 / std::f32::consts::LN_2);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n bounds the loads and stores of s and codes;
        // gather indices lie in 0..=255 (clamped guess, plus one).
        unsafe {
            let x = _mm512_loadu_ps(s.as_ptr().add(i));
            let r = _mm512_mul_ps(x, inv_max);
            let e = _mm512_getexp_ps(r);
            let m = _mm512_getmant_ps::<_MM_MANT_NORM_1_2, _MM_MANT_SIGN_SRC>(r);
            let z = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one));
            let z2 = _mm512_mul_ps(z, z);
            let mut p = _mm512_add_ps(
                _mm512_set1_ps(0.2),
                _mm512_mul_ps(z2, _mm512_set1_ps(1.0 / 7.0)),
            );
            p = _mm512_add_ps(_mm512_set1_ps(1.0 / 3.0), _mm512_mul_ps(z2, p));
            p = _mm512_add_ps(one, _mm512_mul_ps(z2, p));
            let l = _mm512_add_ps(e, _mm512_mul_ps(_mm512_mul_ps(z, p), two_over_ln2));
            let g = _mm512_min_ps(
                _mm512_max_ps(_mm512_mul_ps(l, istep), _mm512_setzero_ps()),
                _mm512_set1_ps(254.0),
            );
            let idx = _mm512_cvttps_epi32(g);
            let t0 = _mm512_i32gather_ps::<4>(idx, t.as_ptr());
            let t1 =
                _mm512_i32gather_ps::<4>(_mm512_add_epi32(idx, _mm512_set1_epi32(1)), t.as_ptr());
            let ok = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(t0, x)
                & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(t1, x)
                & _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_setzero_ps());
            _mm_storeu_si128(
                codes.as_mut_ptr().add(i) as *mut __m128i,
                _mm512_cvtepi32_epi8(idx),
            );
            _mm512_storeu_ps(s.as_mut_ptr().add(i), t0);
            let mut bad = !ok;
            if bad != 0 {
                let mut xs = [0f32; 16];
                _mm512_storeu_ps(xs.as_mut_ptr(), x);
                while bad != 0 {
                    let lane = bad.trailing_zeros() as usize;
                    bad &= bad - 1;
                    let j = i + lane;
                    let (mut x, guess) = (xs[lane], codes[j] as usize);
                    encode_one(&mut x, &mut codes[j], guess, t);
                    s[j] = x;
                }
            }
        }
        i += 16;
    }
    i
}

/// `t[c] = max * exp2_neg(c * step)` for `c = 0..256`: the scalar
/// `scalar::fill_table` lane-wise, the same IEEE operations in the
/// same order (so the tables are bit-identical).
pub(super) fn exp2_table(_proof: Avx512, max: f32, step: f32, t: &mut [f32; 256]) {
    // SAFETY: the token proves AVX-512 F; the stores stay inside `t`.
    unsafe { exp2_table_impl(max, step, t) }
}

/// # Safety
/// The CPU must support AVX-512 F. (`step` in `[-1, 0]` for exact values.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn exp2_table_impl(max: f32, step: f32, t: &mut [f32; 256]) {
    const C: [f32; 6] = EXP2_C;
    let (vmax, vstep) = (_mm512_set1_ps(max), _mm512_set1_ps(step));
    let c: [__m512; 6] = [
        _mm512_set1_ps(C[0]),
        _mm512_set1_ps(C[1]),
        _mm512_set1_ps(C[2]),
        _mm512_set1_ps(C[3]),
        _mm512_set1_ps(C[4]),
        _mm512_set1_ps(C[5]),
    ];
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for k in 0..16 {
        let code = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * k as i32));
        let y = _mm512_mul_ps(_mm512_cvtepi32_ps(code), vstep);
        // (0.5 - y) lies in [0.5, 254.5]: truncation equals Rust's `as i32`.
        let ti = _mm512_min_epi32(
            _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_set1_ps(0.5), y)),
            _mm512_set1_epi32(126),
        );
        let f = _mm512_add_ps(y, _mm512_cvtepi32_ps(ti));
        let mut p = _mm512_add_ps(c[4], _mm512_mul_ps(f, c[5]));
        p = _mm512_add_ps(c[3], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[2], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[1], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(c[0], _mm512_mul_ps(f, p));
        p = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_mul_ps(f, p));
        let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_sub_epi32(
            _mm512_set1_epi32(127),
            ti,
        )));
        // SAFETY: 16 * k + 16 <= 256 = t.len().
        unsafe {
            _mm512_storeu_ps(
                t.as_mut_ptr().add(16 * k),
                _mm512_mul_ps(vmax, _mm512_mul_ps(p, scale)),
            )
        };
    }
}
