//! The forward of the formats stored as output rows (`[out, in]` codes with
//! one multiplier per row or per tensor): the shared engine
//! `crate::linear::kernels::matmul_rows`, called the same way for each.

use crate::error::Result;
use crate::linear::kernels::{matmul_rows, Epilogue, RowSource};

/// `y = (x . R^T) * scale(r) + bias` for `x [rows, in]`, `R` = `src`
/// `[out, in]`.
pub(super) fn forward_rows<S: RowSource>(
    src: &S,
    [out_feat, in_feat]: [usize; 2],
    scale: &(dyn Fn(usize) -> f32 + Sync),
    bias: Option<&[f32]>,
    x: &[f32],
    rows: usize,
    y: &mut [f32],
) -> Result<()> {
    let epi = Epilogue { scale, bias };
    matmul_rows(src, out_feat, in_feat, x, rows, y, &epi);
    Ok(())
}
