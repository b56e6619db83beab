//! The AVX-512 body of `dot::dot_row`: per run of 32, the low and the high
//! nibbles of the 16 bytes each widen to one vector of 16 f32, for the
//! shared group loop `dot::dot_row_body`. The widening is
//! `nibble_widen_512!`, which `int4_k`'s AVX-512 body expands too (the same
//! 16-byte nibble order).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::body::dot_row_body;
use crate::simd::Avx512;

/// The closure `|p: *const u8| -> [__m512; 2]` that widens the 16 bytes at
/// `p` (one run of 32 nibbles: byte `j` holds input `j` low and `j + 16`
/// high) to two vectors of 16 f32, low nibbles first. A macro, not a
/// function, so that it expands inside the caller's `#[target_feature]`
/// function and inlines there as before; `std::arch::x86_64::*` must be in
/// scope where it is expanded.
macro_rules! nibble_widen_512 {
    () => {
        |p: *const u8| -> [__m512; 2] {
            // SAFETY: `p` has 16 bytes (the body's run); AVX-512 F is the
            // feature of the function this expands in.
            unsafe {
                let nib = _mm_set1_epi8(0x0F);
                let b = _mm_loadu_si128(p.cast());
                let lo = _mm_and_si128(b, nib);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
                let f = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
                [f(lo), f(hi)]
            }
        }
    };
}
pub(crate) use nibble_widen_512;

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
    let widen = nibble_widen_512!();
    // SAFETY: AVX-512 F and FMA are this function's features; lengths
    // checked by the caller.
    unsafe { dot_row_body(codes, scales, group_size, x, widen) }
}
