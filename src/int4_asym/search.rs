//! Choosing `(d, m)` of one asymmetric group (`w = d * q + m`, `q` in
//! `0..=15`, `d` and `m` IEEE halves):
//!
//! - `Rtn`: `m = min`, `d = (max - min) / 15`, each rounded to half (ggml
//!   Q4_1's `quantize_row_q4_1_ref`);
//! - `Search`: llama.cpp's `make_qkx2_quants` idea. For trial inverse steps
//!   `(15 + STEP * k) / (max - min)`, `k` in `-STEPS..=STEPS`, round the codes
//!   at that step, then solve the 2x2 weighted least squares for `(d, m)`
//!   given those codes; round `(d, m)` to half, re-assign every code to the
//!   nearest grid point of the rounded values and evaluate the weighted
//!   squared error `sum_i imp[i] * (x[i] - (d * q[i] + m))^2` (the stored
//!   values, float32 as the format decodes them). The `Rtn` pair is the first
//!   candidate and a candidate replaces the best only when strictly better,
//!   so the search is never worse than `Rtn` under that error. The winner is
//!   refined by `REFINE` more least-squares solves on its own codes.
//!
//! The importance `imp` of each input is the layer's mean `x^2` over
//! calibration data (llama.cpp's imatrix), 1 when not given.

use crate::ggml::f32_to_f16;
use crate::linear::fp8_dialect::f16_to_f32;

/// How a group's `(d, m)` are chosen (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsymMethod {
    /// min / max, rounded to half.
    Rtn,
    /// Weighted least-squares search over trial steps.
    Search,
}

impl AsymMethod {
    /// The method named `name` (`"rtn"`, `"search"`).
    pub fn parse(name: &str) -> Option<AsymMethod> {
        match name {
            "rtn" => Some(AsymMethod::Rtn),
            "search" => Some(AsymMethod::Search),
            _ => None,
        }
    }
}

/// Trial steps `k` in `-STEPS..=STEPS` of `STEP` code levels around 15.
const STEPS: i32 = 20;
const STEP: f32 = 0.1;
/// Least-squares refinements of the winner on its own codes.
const REFINE: usize = 2;
/// The largest code.
const QMAX: f32 = 15.0;

/// Quantize one group `x` (finite) into `q` (`x.len()` codes) and return the
/// half bits of `(d, m)`; `imp` weighs each element's squared error
/// (`Search` only).
pub fn quantize_group(
    x: &[f32],
    imp: Option<&[f32]>,
    method: AsymMethod,
    q: &mut [u8],
) -> (u16, u16) {
    let lo = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let rtn = (f32_to_f16((hi - lo) / QMAX), f32_to_f16(lo));
    if method == AsymMethod::Rtn || hi == lo {
        assign(x, rtn, q);
        return rtn;
    }
    let w = |i: usize| imp.map_or(1.0, |v| v[i]);
    let mut best = rtn;
    let mut best_err = group_error(x, imp, rtn.0, rtn.1, q);
    let mut trial = vec![0u8; x.len()];
    let mut consider = |pair: (u16, u16), trial: &mut [u8], q: &mut [u8]| {
        let e = group_error(x, imp, pair.0, pair.1, trial);
        if e < best_err {
            best_err = e;
            best = pair;
            q.copy_from_slice(trial);
        }
    };
    for k in -STEPS..=STEPS {
        let iscale = (QMAX + STEP * k as f32) / (hi - lo);
        for (t, &v) in trial.iter_mut().zip(x) {
            *t = ((v - lo) * iscale).round().clamp(0.0, QMAX) as u8;
        }
        if let Some(pair) = least_squares(x, &w, &trial) {
            consider(pair, &mut trial, q);
        }
    }
    for _ in 0..REFINE {
        let Some(pair) = least_squares(x, &w, q) else {
            break;
        };
        trial.copy_from_slice(q);
        consider(pair, &mut trial, q);
    }
    // `q` holds the codes of `best` (assigned by `group_error`).
    best
}

/// The weighted least-squares `(d, m)` for codes `q`, rounded to half; None
/// when the system is singular or the result overflows a half.
fn least_squares(x: &[f32], w: &dyn Fn(usize) -> f32, q: &[u8]) -> Option<(u16, u16)> {
    let (mut sw, mut sl, mut sl2, mut sx, mut sxl) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (i, (&v, &c)) in x.iter().zip(q).enumerate() {
        let (wi, l, v) = (f64::from(w(i)), f64::from(c), f64::from(v));
        sw += wi;
        sl += wi * l;
        sl2 += wi * l * l;
        sx += wi * v;
        sxl += wi * v * l;
    }
    let det = sw * sl2 - sl * sl;
    if det <= 0.0 {
        return None;
    }
    let d = (sw * sxl - sx * sl) / det;
    let m = (sl2 * sx - sl * sxl) / det;
    let pair = (f32_to_f16(d as f32), f32_to_f16(m as f32));
    let finite = |h: u16| h & 0x7C00 != 0x7C00;
    (finite(pair.0) && finite(pair.1)).then_some(pair)
}

/// Nearest codes of `x` on the grid of the half pair `(d, m)`.
fn assign(x: &[f32], (d, m): (u16, u16), q: &mut [u8]) {
    let (d, m) = (f16_to_f32(d), f16_to_f32(m));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (c, &v) in q.iter_mut().zip(x) {
        *c = ((v - m) * id).round().clamp(0.0, QMAX) as u8;
    }
}

/// The weighted squared error `sum imp[i] * (x[i] - (d * q[i] + m))^2` (f64
/// sum of the float32 decoded values) of `x` quantized to the nearest codes
/// of the half pair `(d, m)`; those codes are written to `q`. Infinite for a
/// non-finite pair.
pub fn group_error(x: &[f32], imp: Option<&[f32]>, d: u16, m: u16, q: &mut [u8]) -> f64 {
    if d & 0x7C00 == 0x7C00 || m & 0x7C00 == 0x7C00 {
        return f64::INFINITY;
    }
    assign(x, (d, m), q);
    let (df, mf) = (f16_to_f32(d), f16_to_f32(m));
    x.iter()
        .zip(q.iter())
        .enumerate()
        .map(|(i, (&v, &c))| {
            let e = f64::from(v) - f64::from(df * f32::from(c) + mf);
            f64::from(imp.map_or(1.0, |w| w[i])) * e * e
        })
        .sum()
}
