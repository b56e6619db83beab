//! The AVX2 body of `dot::dot_row`: per run of 32, the 16 bytes are split
//! into low and high nibbles, each widened to two vectors of 8 f32 and
//! multiply-added with `x`; `x` is summed in a second pair of accumulators;
//! per group both are scaled by `d` and `m` into the row's accumulator.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::half;
use crate::simd::{Avx2, F32Lanes};

/// # Safety
/// None beyond the token (AVX2 and FMA); the caller (`dot::dot_row`)
/// checks `x.len() == 2 * codes.len()`, a multiple of 32, and one `(d, m)`
/// pair per group; `group_size` is a multiple of 32.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_row(
    _: Avx2,
    codes: &[u8],
    scales: &[u16],
    group_size: usize,
    x: &[f32],
) -> f32 {
    let (pb, px) = (codes.as_ptr(), x.as_ptr());
    let nib = _mm_set1_epi8(0x0F);
    let mut total = _mm256_setzero_ps();
    for (g, dm) in scales.chunks_exact(2).enumerate() {
        let (start, end) = (g * group_size, ((g + 1) * group_size).min(x.len()));
        let (mut q0, mut q1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = start;
        while i < end {
            // SAFETY: run i / 32 has 16 bytes at i / 2 and 32 floats at i,
            // in bounds by the caller's length checks.
            unsafe {
                let b = _mm_loadu_si128(pb.add(i / 2).cast());
                let lo = _mm_and_si128(b, nib);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
                for (k, nibbles) in [lo, hi].into_iter().enumerate() {
                    let w0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nibbles));
                    let w1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(nibbles)));
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
        let (d, m) = (_mm256_set1_ps(half(dm[0])), _mm256_set1_ps(half(dm[1])));
        total = _mm256_fmadd_ps(d, _mm256_add_ps(q0, q1), total);
        total = _mm256_fmadd_ps(m, _mm256_add_ps(s0, s1), total);
    }
    // SAFETY: this function's features include AVX2.
    unsafe { total.hsum() }
}
