//! Forwards over codes someone else owns (a torch module's buffers seen
//! through NumPy): per-row int8 and per-tensor FP8 E4M3, through the same
//! row engine (`kernels::matmul_rows`) as [`Int8Linear`](super::Int8Linear)
//! and [`PerTensorFP8Linear`](super::PerTensorFP8Linear), so a layer that
//! keeps its weight in a tensor holds it once. Every length is checked (in
//! O(1)); the values of the codes and scales are the caller's (any value
//! gives some output, never an out-of-bounds read).

use super::fp8_linear::prepare_fp8;
use super::kernels::{matmul_rows, matmul_rows_in_range, Epilogue};
use super::{check_bias, rows_of};
use crate::error::{QuantError, Result};
use crate::format::{check_scale, E4m3Rows, Int8Rows};

/// `len` codes make `[out, in]` (both >= 1), or an error naming `what`.
fn check_codes_len(what: &str, len: usize, [out, inf]: [usize; 2]) -> Result<()> {
    if out == 0 || inf == 0 || Some(len) != out.checked_mul(inf) {
        return Err(QuantError::dims(
            what,
            format!("{out} x {inf} codes (out, in >= 1)"),
            len,
        ));
    }
    Ok(())
}

/// `y = (x . q^T) * scales + bias` for int8 codes `q` `[out, in]`, one scale
/// per output row, `x` `[rows, in]`, `y` `[rows, out]`.
pub fn int8_forward(
    q: &[i8],
    scales: &[f32],
    shape: [usize; 2],
    bias: Option<&[f32]>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let [out, inf] = shape;
    check_codes_len("weight", q.len(), shape)?;
    if scales.len() != out {
        return Err(QuantError::dims("scales", format!("[{out}]"), scales.len()));
    }
    check_bias(bias, out)?;
    let rows = rows_of(x, y, inf, out)?;
    let epi = Epilogue {
        scale: &|r| scales[r],
        bias,
    };
    matmul_rows(&Int8Rows { q, k: inf }, out, inf, x, rows, y, &epi);
    Ok(())
}

/// `y = x . dec(codes)^T * weight_scale_inv + bias` for E4M3 `codes`
/// `[out, in]`, with `x` first put on the E4M3 grid of `activation_scale`
/// where one is given (W8A8; see `PerTensorFP8Linear`).
pub fn fp8_forward(
    codes: &[u8],
    shape: [usize; 2],
    weight_scale_inv: f32,
    activation_scale: Option<f32>,
    bias: Option<&[f32]>,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let [out, inf] = shape;
    check_codes_len("weight", codes.len(), shape)?;
    check_scale("weight_scale_inv", weight_scale_inv)?;
    if let Some(a) = activation_scale {
        check_scale("activation_scale", a)?;
    }
    check_bias(bias, out)?;
    let rows = rows_of(x, y, inf, out)?;
    let (xs, mult) = prepare_fp8(x, activation_scale, weight_scale_inv);
    let epi = Epilogue {
        scale: &|_| mult,
        bias,
    };
    let src = E4m3Rows { codes, k: inf };
    if activation_scale.is_some() {
        // On the E4M3 grid (`prepare_fp8`): |x| <= 448, in range.
        matmul_rows_in_range(&src, out, inf, &xs, rows, y, &epi);
    } else {
        matmul_rows(&src, out, inf, &xs, rows, y, &epi);
    }
    Ok(())
}
