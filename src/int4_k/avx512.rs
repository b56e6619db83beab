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
    // The nibble order of `int4_asym`'s runs: its widening, expanded here.
    let widen = crate::int4_asym::avx512::nibble_widen_512!();
    // SAFETY: AVX-512 F and FMA are this function's features; lengths
    // checked by the caller.
    unsafe { dot_row_body(codes, sc_row, supers, gps, x, widen) }
}
