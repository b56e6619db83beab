//! The AVX-512 body of `dot::dot_row`: per run of 32, the low and the high
//! nibbles of the 16 bytes each widen to one vector of 16 f32, multiply-added
//! with `x`; `x` is summed in a second pair of accumulators; per group both
//! are scaled by `d` and `m` into the row's accumulator.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::half;
use crate::simd::{Avx512, F32Lanes};

/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); the caller (`dot::dot_row`)
/// checks `x.len() == 2 * codes.len()`, a multiple of 32, and one `(d, m)`
/// pair per group; `group_size` is a multiple of 32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_row(
    _: Avx512,
    codes: &[u8],
    scales: &[u16],
    group_size: usize,
    x: &[f32],
) -> f32 {
    let (pb, px) = (codes.as_ptr(), x.as_ptr());
    let nib = _mm_set1_epi8(0x0F);
    let mut total = _mm512_setzero_ps();
    for (g, dm) in scales.chunks_exact(2).enumerate() {
        let (start, end) = (g * group_size, ((g + 1) * group_size).min(x.len()));
        let (mut q0, mut q1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = start;
        while i < end {
            // SAFETY: run i / 32 has 16 bytes at i / 2 and 32 floats at i,
            // in bounds by the caller's length checks.
            unsafe {
                let b = _mm_loadu_si128(pb.add(i / 2).cast());
                let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, nib)));
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
                let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi));
                let x0 = _mm512_loadu_ps(px.add(i));
                let x1 = _mm512_loadu_ps(px.add(i + 16));
                q0 = _mm512_fmadd_ps(lo, x0, q0);
                q1 = _mm512_fmadd_ps(hi, x1, q1);
                s0 = _mm512_add_ps(s0, x0);
                s1 = _mm512_add_ps(s1, x1);
            }
            i += 32;
        }
        let (d, m) = (_mm512_set1_ps(half(dm[0])), _mm512_set1_ps(half(dm[1])));
        total = _mm512_fmadd_ps(d, _mm512_add_ps(q0, q1), total);
        total = _mm512_fmadd_ps(m, _mm512_add_ps(s0, s1), total);
    }
    // SAFETY: this function's features include AVX-512 F.
    unsafe { total.hsum() }
}
