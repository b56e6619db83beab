//! The AVX-512 kernels of every block type: `body.rs` on `__m512` (the
//! code extraction stays on 256-bit AVX2 integer instructions).

use std::arch::x86_64::__m512;

use super::body::{decode_body, dot_row_body};
use super::GgmlType;
use crate::simd::Avx512;

/// # Safety
/// None beyond the token (AVX-512 F/BW/VL); the caller (`fused::dot_row`)
/// checks the lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dot_row<T: GgmlType>(_: Avx512, row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: AVX-512 F and AVX2 are this function's features; lengths
    // checked by the caller.
    unsafe { dot_row_body::<T, __m512>(row, x) }
}

/// # Safety
/// None beyond the token; the caller (`fused::decode_block`) checks the
/// lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn decode_block<T: GgmlType>(_: Avx512, b: &[u8], out: &mut [f32]) {
    // SAFETY: as `dot_row`.
    unsafe { decode_body::<T, __m512>(b, out) }
}
