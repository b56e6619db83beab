//! The AVX-512 body of `dot::qx_sx`: per run of 32, the low and the high
//! nibbles of the 16 bytes each widen to one vector of 16 f32, multiply-added
//! with `x`; `x` is summed in a second accumulator.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::simd::{Avx512, F32Lanes};

/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); `x.len() == 2 * bytes.len()`, a
/// multiple of 32 (checked).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn qx_sx(_: Avx512, bytes: &[u8], x: &[f32]) -> (f32, f32) {
    assert!(x.len() == 2 * bytes.len() && x.len().is_multiple_of(32));
    let (pb, px) = (bytes.as_ptr(), x.as_ptr());
    let (mut q0, mut q1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let nib = _mm_set1_epi8(0x0F);
    let mut i = 0;
    while i < x.len() {
        // SAFETY: run i / 32 has 16 bytes at i / 2 and 32 floats at i, both in
        // bounds by the assert.
        unsafe {
            let b = _mm_loadu_si128(pb.add(i / 2).cast());
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, nib)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(
                _mm_srli_epi16::<4>(b),
                nib,
            )));
            let x0 = _mm512_loadu_ps(px.add(i));
            let x1 = _mm512_loadu_ps(px.add(i + 16));
            q0 = _mm512_fmadd_ps(lo, x0, q0);
            q1 = _mm512_fmadd_ps(hi, x1, q1);
            s0 = _mm512_add_ps(s0, x0);
            s1 = _mm512_add_ps(s1, x1);
        }
        i += 32;
    }
    // SAFETY: this function's features include AVX-512 F.
    unsafe { (_mm512_add_ps(q0, q1).hsum(), _mm512_add_ps(s0, s1).hsum()) }
}
