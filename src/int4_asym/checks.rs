//! The argument checks and the row decode that the output-major
//! nibble-group weights share (`int4_asym`, `int4_k`, `int_zp`): one
//! wording of each error, so the formats name bad input alike.

use std::ops::Range;

use rayon::prelude::*;

use crate::error::{QuantError, Result};

/// Check `group_size` (a positive multiple of `run`) and the shape
/// `[out, in]` (positive, `in` a multiple of `run`) of a weight of format
/// `format`; returns the groups per row (the last may be shorter).
pub(crate) fn group_shape(
    format: &str,
    run: usize,
    out_feat: usize,
    in_feat: usize,
    group_size: usize,
) -> Result<usize> {
    if group_size == 0 || !group_size.is_multiple_of(run) {
        return Err(QuantError::arg(format!(
            "group_size: expected a positive multiple of {run}, got {group_size}"
        )));
    }
    if out_feat == 0 || in_feat == 0 || !in_feat.is_multiple_of(run) {
        return Err(QuantError::arg(format!(
            "{format} weight shape [{out_feat}, {in_feat}]: expected positive dims with in \
             a multiple of {run}"
        )));
    }
    Ok(in_feat.div_ceil(group_size))
}

/// `v` holds `rows x cols` values, each `0..=max`; the errors name `name`
/// and the first value out of range by its `[row, col]`.
pub(crate) fn codes(name: &str, v: &[u8], rows: usize, cols: usize, max: u32) -> Result<()> {
    if Some(v.len()) != rows.checked_mul(cols) {
        return Err(QuantError::dims(name, format!("{rows} x {cols}"), v.len()));
    }
    at_most(name, v, cols, max)
}

/// Every value of `v` (`[_, cols]`) at most `max`, or an error naming
/// `name` and the first one that is not.
pub(crate) fn at_most(name: &str, v: &[u8], cols: usize, max: u32) -> Result<()> {
    match v.iter().position(|&c| u32::from(c) > max) {
        None => Ok(()),
        Some(i) => Err(QuantError::arg(format!(
            "{name}[{}, {}] is {}, expected 0..={max}",
            i / cols,
            i % cols,
            v[i]
        ))),
    }
}

/// The largest |w| a quantizer takes: the largest finite half. Every format
/// quantized from float here stores its steps and minimums as halves
/// (ggml's blocks, `int4_asym`'s `(d, m)`, `int4_k`'s `(D, Dmin)`), so
/// beyond it a step or a minimum would round to infinity; any float16 or
/// bfloat16 checkpoint's weights are within it.
pub(crate) const MAX_ABS_WEIGHT: f32 = 65504.0;

/// The length of `w` (`out x in`) and the optional `importance`: `in`
/// values, finite and >= 0; the values of `w` are left to [`weight_row`],
/// so that a row-parallel quantizer checks each row while it is in cache.
pub(crate) fn float_shape(
    w: &[f32],
    out_feat: usize,
    in_feat: usize,
    importance: Option<&[f32]>,
) -> Result<()> {
    if Some(w.len()) != out_feat.checked_mul(in_feat) {
        let want = format!("{out_feat} x {in_feat}");
        return Err(QuantError::dims("weight length", want, w.len()));
    }
    let Some(imp) = importance else { return Ok(()) };
    if imp.len() != in_feat {
        return Err(QuantError::dims("importance", in_feat, imp.len()));
    }
    if let Some(i) = imp.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(QuantError::arg(format!(
            "importance[{i}] is {}, expected finite and >= 0",
            imp[i]
        )));
    }
    Ok(())
}

/// Row `r` of the weight `w`: every value finite with |w| <=
/// [`MAX_ABS_WEIGHT`], else an error naming the first one that is not as
/// `w[r, c]` (the name the Python quantizers give their argument).
pub(crate) fn weight_row(r: usize, row: &[f32]) -> Result<()> {
    // NaN fails `<=`; a branch-free fold keeps the pass vectorized, and the
    // search for the bad value only runs when there is one.
    if row
        .iter()
        .fold(true, |ok, v| ok & (v.abs() <= MAX_ABS_WEIGHT))
    {
        return Ok(());
    }
    let c = row
        .iter()
        .position(|v| v.is_nan() || v.abs() > MAX_ABS_WEIGHT)
        .unwrap_or(0);
    Err(QuantError::arg(format!(
        "w[{r}, {c}] is {:?}, expected a finite value with |w| <= {MAX_ABS_WEIGHT} (the \
         largest half, which the scales are stored in)",
        row[c]
    )))
}

/// Rows `rows` (checked by the caller) of an `[_, in_feat]` weight as
/// float32 `[rows.len(), in_feat]`, each decoded by `decode(r, out_row)`,
/// rows in parallel.
pub(crate) fn decode_rows(
    rows: Range<usize>,
    in_feat: usize,
    decode: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let mut out = vec![0f32; rows.len() * in_feat];
    out.par_chunks_mut(in_feat)
        .zip(rows)
        .for_each(|(o, r)| decode(r, o));
    out
}
