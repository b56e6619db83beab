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

/// The float weight `w` of a quantizer: `out x in` values, all finite; and
/// its optional `importance`: `in` values, finite and >= 0.
pub(crate) fn float_rows(
    w: &[f32],
    out_feat: usize,
    in_feat: usize,
    importance: Option<&[f32]>,
) -> Result<()> {
    if Some(w.len()) != out_feat.checked_mul(in_feat) {
        let want = format!("{out_feat} x {in_feat}");
        return Err(QuantError::dims("weight length", want, w.len()));
    }
    // A branch-free pass per chunk (vectorized) first: the search for the
    // first bad value only runs when there is one.
    let finite = |c: &[f32]| c.iter().fold(true, |ok, v| ok & v.is_finite());
    if !w.chunks(1 << 12).all(finite) {
        let i = w.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(QuantError::arg(format!(
            "weight[{}, {}] is {}, expected finite",
            i / in_feat,
            i % in_feat,
            w[i]
        )));
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
