//! The AVX2 kernels of every block type: `body.rs` on `__m256`.

use std::arch::x86_64::__m256;

use super::body::{decode_body, dot_row_body};
use super::GgmlType;
use crate::simd::Avx2;

/// # Safety
/// None beyond the token (AVX2 and FMA); the caller (`fused::dot_row`)
/// checks the lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_row<T: GgmlType>(_: Avx2, row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: AVX2 and FMA are this function's features; lengths checked by
    // the caller.
    unsafe { dot_row_body::<T, __m256>(row, x) }
}

/// # Safety
/// None beyond the token; the caller (`fused::decode_block`) checks the
/// lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode_block<T: GgmlType>(_: Avx2, b: &[u8], out: &mut [f32]) {
    // SAFETY: as `dot_row`.
    unsafe { decode_body::<T, __m256>(b, out) }
}
