//! Choosing the per-group scales of the symmetric INT4 grid (codes -8..7,
//! `w ~ code * scale`) by the quantizer methods of docs/int4.md "Quantizers":
//!
//! - `Rtn`: `absmax / 7` (15 of the 16 codes; the historical grid, kept
//!   bit-identical so that old files and tests stay valid);
//! - `Full`: the signed value of largest magnitude maps to code -8
//!   (`scale = max / -8`, llama.cpp's Q4_0 rule), all 16 codes used;
//! - `Search`: per group and output, the scale minimizing the weighted squared
//!   error `sum_r imp[r] * (w - code * scale)^2` among candidates around
//!   `max / -8` (llama.cpp's `make_qx_quants` idea: round at a trial inverse
//!   scale, then take the least-squares scale for those codes), always
//!   including the `Rtn` and `Full` scales, so it is never worse than either
//!   under that error. `imp` is the importance of each input (the layer's mean
//!   `x^2` over calibration data, llama.cpp's imatrix), 1 when not given.
//!
//! Every method only picks scales: the codes are then rounded from the scale
//! by `quantize::pack`, so the stored format is the same for all of them.

use rayon::prelude::*;

use super::quantize::{absmax_scales, quantize_value};
use super::{Layout, MIN_SCALE};

/// How the per-group scales are chosen (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleMethod {
    /// `absmax / 7` (round to nearest on the 15-code grid).
    Rtn,
    /// `max / -8`: all 16 codes (llama.cpp Q4_0's rule).
    Full,
    /// Weighted least-squares search over candidate scales.
    Search,
}

impl ScaleMethod {
    /// The method named `name` (`"rtn"`, `"full"`, `"search"`).
    pub fn parse(name: &str) -> Option<ScaleMethod> {
        match name {
            "rtn" => Some(ScaleMethod::Rtn),
            "full" => Some(ScaleMethod::Full),
            "search" => Some(ScaleMethod::Search),
            _ => None,
        }
    }
}

/// Trial inverse scales `-(8 + STEP * k) / max` for `k` in `-STEPS..=STEPS`.
const STEPS: i32 = 10;
const STEP: f32 = 0.1;

/// Scales `[num_groups * out_feat]` for `w` `[in_feat, out_feat]` by `method`;
/// `importance` (length `in_feat`, finite, >= 0) weights the error of each
/// input row in `Search` and is ignored otherwise.
pub fn scales(
    w: &[f32],
    in_feat: usize,
    out_feat: usize,
    layout: &Layout,
    method: ScaleMethod,
    importance: Option<&[f32]>,
) -> Vec<f32> {
    if method == ScaleMethod::Rtn {
        return absmax_scales(w, in_feat, out_feat, layout);
    }
    let gs = layout.group_size;
    let mut scales = vec![0.0f32; layout.num_groups * out_feat];
    let one_group = |(g, srow): (usize, &mut [f32])| {
        let rows = (g * gs).min(in_feat)..((g + 1) * gs).min(in_feat);
        let mut x = vec![0.0f32; rows.len()];
        let imp: Vec<f32> = match importance {
            Some(imp) => imp[rows.clone()].to_vec(),
            None => vec![1.0; rows.len()],
        };
        for (o, s) in srow.iter_mut().enumerate() {
            for (xi, r) in x.iter_mut().zip(rows.clone()) {
                *xi = w[r * out_feat + o];
            }
            *s = group_scale(&x, &imp, method);
        }
    };
    // Always split by group: the search makes ~45 passes over each group.
    scales
        .par_chunks_mut(out_feat)
        .enumerate()
        .for_each(one_group);
    scales
}

/// `max(|s|, MIN_SCALE)` with the sign of `s`: a scale the kernels can use.
fn usable(s: f32) -> f32 {
    if s.abs() >= MIN_SCALE {
        s
    } else {
        MIN_SCALE
    }
}

/// The scale of one group `x` with error weights `imp` (same length).
fn group_scale(x: &[f32], imp: &[f32], method: ScaleMethod) -> f32 {
    // The value of largest magnitude, with its sign (the first one on ties).
    let max = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let rtn = (max.abs() / 7.0).max(MIN_SCALE);
    if method == ScaleMethod::Rtn {
        return rtn;
    }
    let full = usable(max / -8.0);
    if method == ScaleMethod::Full || max == 0.0 {
        return full;
    }
    let mut best = (weighted_error(x, imp, rtn), rtn);
    let mut consider = |s: f32| {
        let e = weighted_error(x, imp, s);
        if e < best.0 {
            best = (e, s);
        }
    };
    consider(full);
    for k in -STEPS..=STEPS {
        let inv = -(8.0 + STEP * k as f32) / max;
        // Least-squares scale for the codes rounded at this trial scale.
        let (mut sum_xl, mut sum_ll) = (0.0f32, 0.0f32);
        for (&v, &i) in x.iter().zip(imp) {
            let q = quantize_value(v, 1.0 / inv) as f32;
            sum_xl += i * v * q;
            sum_ll += i * q * q;
        }
        if sum_ll > 0.0 {
            consider(usable(sum_xl / sum_ll));
        }
    }
    best.1
}

/// `sum imp * (x - code(x, s) * s)^2` with the codes `pack` stores.
fn weighted_error(x: &[f32], imp: &[f32], s: f32) -> f32 {
    x.iter()
        .zip(imp)
        .map(|(&v, &i)| {
            let d = v - quantize_value(v, s) as f32 * s;
            i * d * d
        })
        .sum()
}
