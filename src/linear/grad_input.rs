//! The input gradient of a layer whose weight is stored as output rows
//! (`[out, in]` codes, one multiplier per row or per tensor):
//! `dx = g . (scale(o) * R[o])` for `g` `[rows, out]`, `dx` `[rows, in]`
//! (docs/torch.md, "Fine-tuning on quantized weights").
//!
//! The weight is decoded a strip of `STRIP` input columns at a time, one
//! output row after another, and each decoded strip row is added to the
//! strip of `dx` with `g[b, o] * scale(o)` as its factor: the f32 weight
//! never exists beyond one strip row, and strips run in parallel (rayon).

use rayon::prelude::*;

use super::kernels::RowSource;
use crate::error::{QuantError, Result};

/// Input columns per strip: a decoded strip row and the strip of a few
/// rows of `dx` stay in L1.
const STRIP: usize = 256;

/// `dx = g . diag(scale) . R` with the rows of `src` (`[out_feat, in_feat]`).
pub(crate) fn grad_input_rows<S: RowSource>(
    src: &S,
    [out_feat, in_feat]: [usize; 2],
    scale: &(dyn Fn(usize) -> f32 + Sync),
    g: &[f32],
    rows: usize,
    dx: &mut [f32],
) -> Result<()> {
    if rows.checked_mul(out_feat) != Some(g.len()) {
        return Err(QuantError::dims(
            "grad_output",
            format!("[{rows}, {out_feat}]"),
            format!("{} elements", g.len()),
        ));
    }
    if rows.checked_mul(in_feat) != Some(dx.len()) {
        return Err(QuantError::dims(
            "dx",
            format!("[{rows}, {in_feat}]"),
            format!("{} elements", dx.len()),
        ));
    }
    if rows == 0 {
        return Ok(());
    }
    let strips: Vec<(usize, Vec<f32>)> = (0..in_feat.div_ceil(STRIP))
        .into_par_iter()
        .map(|si| {
            let k0 = si * STRIP;
            let w = STRIP.min(in_feat - k0);
            let mut acc = vec![0f32; rows * w];
            let mut wrow = vec![0f32; w];
            for o in 0..out_feat {
                src.decode(o, k0, &mut wrow);
                let s = scale(o);
                for (b, a) in acc.chunks_exact_mut(w).enumerate() {
                    let c = g[b * out_feat + o] * s;
                    for (ai, wi) in a.iter_mut().zip(&wrow) {
                        *ai += c * wi;
                    }
                }
            }
            (k0, acc)
        })
        .collect();
    for (k0, acc) in strips {
        let w = acc.len() / rows;
        for (b, a) in acc.chunks_exact(w).enumerate() {
            dx[b * in_feat + k0..b * in_feat + k0 + w].copy_from_slice(a);
        }
    }
    Ok(())
}
