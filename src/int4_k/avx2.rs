//! The AVX2 body of `dot::dot_row`: per group of 32, the 16 bytes are split
//! into low and high nibbles, each widened to two vectors of 8 f32, for
//! the shared group loop `body::dot_row_body`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::dot_row_body;
use crate::simd::Avx2;

/// # Safety
/// None beyond the token (AVX2 and FMA); the caller (`dot::dot_row`)
/// checks the lengths of `codes`, `sc_row`, `supers` against `x`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_row(
    _: Avx2,
    codes: &[u8],
    sc_row: &[u8],
    supers: &[u16],
    gps: usize,
    x: &[f32],
) -> f32 {
    let widen = |p: *const u8| -> [__m256; 4] {
        // SAFETY: `p` has 16 bytes (the body's group); AVX2 is this
        // function's feature.
        unsafe {
            let nib = _mm_set1_epi8(0x0F);
            let b = _mm_loadu_si128(p.cast());
            let lo = _mm_and_si128(b, nib);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
            let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
            [
                f(lo),
                f(_mm_srli_si128::<8>(lo)),
                f(hi),
                f(_mm_srli_si128::<8>(hi)),
            ]
        }
    };
    // SAFETY: AVX2 and FMA are this function's features; lengths checked by
    // the caller.
    unsafe { dot_row_body(codes, sc_row, supers, gps, x, widen) }
}
