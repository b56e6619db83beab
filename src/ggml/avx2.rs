//! The AVX2 kernels of every block type: the row dot is the multi-row
//! kernel of `rows_avx2.rs` on one row, the block decode `body.rs` on
//! `__m256`.

use std::arch::x86_64::__m256;

use super::body::decode_body;
use super::GgmlType;
use crate::simd::Avx2;

/// `row . x` (the caller, `fused::dot_row`, checks the lengths).
pub(super) fn dot_row<T: GgmlType>(t: Avx2, row: &[u8], x: &[f32]) -> f32 {
    let mut out = [0f32];
    super::rows_avx2::dot_rows::<T>(t, row, row.len(), 0, x, &mut out);
    out[0]
}

/// # Safety
/// None beyond the token; the caller (`fused::decode_block`) checks the
/// lengths.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decode_block<T: GgmlType>(_: Avx2, b: &[u8], out: &mut [f32]) {
    // SAFETY: as `dot_row`.
    unsafe { decode_body::<T, __m256>(b, out) }
}
