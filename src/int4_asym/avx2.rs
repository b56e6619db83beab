//! The AVX2 body of `dot::qx_sx`: per run of 32, the 16 bytes are split
//! into low and high nibbles, each widened to two vectors of 8 f32 and
//! multiply-added with `x`; `x` is summed in a second accumulator.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::simd::{Avx2, F32Lanes};

/// # Safety
/// None beyond the token (AVX2 and FMA); `x.len() == 2 * bytes.len()`, a
/// multiple of 32 (checked).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn qx_sx(_: Avx2, bytes: &[u8], x: &[f32]) -> (f32, f32) {
    assert!(x.len() == 2 * bytes.len() && x.len().is_multiple_of(32));
    let (pb, px) = (bytes.as_ptr(), x.as_ptr());
    let (mut q0, mut q1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let nib = _mm_set1_epi8(0x0F);
    let mut i = 0;
    while i < x.len() {
        // SAFETY: run i / 32 has 16 bytes at i / 2 and 32 floats at i, both in
        // bounds by the assert.
        unsafe {
            let b = _mm_loadu_si128(pb.add(i / 2).cast());
            let lo = _mm_and_si128(b, nib);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
            for (k, half) in [lo, hi].into_iter().enumerate() {
                let w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half));
                let w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(half)));
                let x0 = _mm256_loadu_ps(px.add(i + 16 * k));
                let x1 = _mm256_loadu_ps(px.add(i + 16 * k + 8));
                q0 = _mm256_fmadd_ps(w0, x0, q0);
                q1 = _mm256_fmadd_ps(w1, x1, q1);
                s0 = _mm256_add_ps(s0, x0);
                s1 = _mm256_add_ps(s1, x1);
            }
        }
        i += 32;
    }
    // SAFETY: this function's features include AVX2.
    unsafe { (_mm256_add_ps(q0, q1).hsum(), _mm256_add_ps(s0, s1).hsum()) }
}
