//! The AVX-512 body of `dot::dot_row`: per group of 32, the low and the
//! high nibbles of the 16 bytes each widen to one vector of 16 f32, for the
//! shared group loop `body::dot_row_body`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::dot_row_body;
use crate::simd::Avx512;

/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); the caller (`dot::dot_row`)
/// checks the lengths of `codes`, `sc_row`, `supers` against `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_row(
    _: Avx512,
    codes: &[u8],
    sc_row: &[u8],
    supers: &[u16],
    gps: usize,
    x: &[f32],
) -> f32 {
    let widen = |p: *const u8| -> [__m512; 2] {
        // SAFETY: `p` has 16 bytes (the body's group); AVX-512 F is this
        // function's feature.
        unsafe {
            let nib = _mm_set1_epi8(0x0F);
            let b = _mm_loadu_si128(p.cast());
            let lo = _mm_and_si128(b, nib);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
            let f = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
            [f(lo), f(hi)]
        }
    };
    // SAFETY: AVX-512 F and FMA are this function's features; lengths
    // checked by the caller.
    unsafe { dot_row_body(codes, sc_row, supers, gps, x, widen) }
}
