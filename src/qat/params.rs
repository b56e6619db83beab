//! Integer quantization parameters and calibration.
//!
//! Per tensor (docs/qat.md):
//! - symmetric: `scale = absmax / qmax`, `zero_point = 0`;
//! - affine: `[min, max]` widened to include 0,
//!   `scale = (max - min) / (qmax - qmin)`,
//!   `zero_point = clamp(round_half_even(qmin - min / scale), qmin, qmax)`.
//!
//! Percentile calibration replaces min / max (or absmax) by quantiles that
//! clip `clip_fraction` of the values on each side (absmax: of `|x|`), with
//! NumPy's default linear interpolation between order statistics.
//! Per-channel calibration does the same for each index along one axis of a
//! 2-D tensor (`axis` is the channel axis, as PyTorch's `ch_axis`).

use rayon::prelude::*;

use super::config::{IntDtype, QuantScheme};
use super::element::zero_if_finite;
use crate::error::{QuantError, Result};

/// `scale`, `zero_point` and the integer range of one quantizer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantParams {
    /// Step between codes.
    pub scale: f64,
    /// The code of 0.
    pub zero_point: i32,
    /// Smallest code.
    pub qmin: i32,
    /// Largest code.
    pub qmax: i32,
}

impl QuantParams {
    /// Validated constructor: `scale` finite and > 0, `qmin < qmax`,
    /// `zero_point` in `[qmin, qmax]`.
    pub fn new(scale: f64, zero_point: i32, qmin: i32, qmax: i32) -> Result<QuantParams> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(QuantError::arg(format!(
                "scale: expected a finite value > 0, got {scale}"
            )));
        }
        if qmin >= qmax {
            return Err(QuantError::arg(format!(
                "qmin/qmax: expected qmin < qmax, got qmin={qmin}, qmax={qmax}"
            )));
        }
        if !(qmin..=qmax).contains(&zero_point) {
            return Err(QuantError::arg(format!(
                "zero_point: expected a value in [{qmin}, {qmax}], got {zero_point}"
            )));
        }
        Ok(QuantParams {
            scale,
            zero_point,
            qmin,
            qmax,
        })
    }

    /// Symmetric parameters for `absmax` (zero point 0, balanced range).
    /// `absmax` must be finite and > 0: a zero range has no scale.
    pub fn from_absmax(absmax: f64, dtype: IntDtype) -> Result<QuantParams> {
        if !(absmax.is_finite() && absmax >= 0.0) {
            return Err(QuantError::arg(format!(
                "absmax: expected a finite value >= 0, got {absmax}"
            )));
        }
        let (qmin, qmax) = dtype.range(QuantScheme::Symmetric);
        let scale = absmax / qmax as f64;
        if scale <= 0.0 {
            return Err(QuantError::InvalidState(format!(
                "degenerate calibration: absmax is {absmax:e}, so the scale would be 0 \
                 (an all-zero tensor cannot be calibrated)"
            )));
        }
        QuantParams::new(scale, 0, qmin, qmax)
    }

    /// Parameters for the range `[min, max]` under `scheme` (symmetric uses
    /// `max(|min|, |max|)`).
    pub fn from_minmax(
        min: f64,
        max: f64,
        dtype: IntDtype,
        scheme: QuantScheme,
    ) -> Result<QuantParams> {
        if !(min.is_finite() && max.is_finite()) {
            return Err(QuantError::arg(format!(
                "min/max: expected finite values, got min={min}, max={max}"
            )));
        }
        if min > max {
            return Err(QuantError::arg(format!(
                "min/max: expected min <= max, got min={min}, max={max}"
            )));
        }
        match scheme {
            QuantScheme::Symmetric => QuantParams::from_absmax(min.abs().max(max.abs()), dtype),
            QuantScheme::Affine => {
                let (lo, hi) = (min.min(0.0), max.max(0.0));
                let (qmin, qmax) = dtype.range(scheme);
                let scale = (hi - lo) / (qmax - qmin) as f64;
                if scale <= 0.0 || !scale.is_finite() {
                    return Err(QuantError::InvalidState(format!(
                        "degenerate calibration: range [{min:e}, {max:e}] gives scale {scale:e} \
                         (an all-zero tensor cannot be calibrated)"
                    )));
                }
                let zp = (qmin as f64 - lo / scale)
                    .round_ties_even()
                    .clamp(qmin as f64, qmax as f64);
                QuantParams::new(scale, zp as i32, qmin, qmax)
            }
        }
    }

    /// Whether the codes fit in an `i8`.
    pub fn fits_i8(&self) -> bool {
        self.qmin >= i8::MIN as i32 && self.qmax <= i8::MAX as i32
    }
}

/// Min and max of `x`, or an error naming the first non-finite index.
pub fn finite_minmax<T: Copy + Into<f64> + Sync>(x: &[T], what: &str) -> Result<(f64, f64)> {
    if x.is_empty() {
        return Err(QuantError::InvalidState(format!("{what}: empty tensor")));
    }
    let (mn, mx, bad) = x
        .par_chunks(1 << 14)
        .map(|c| {
            let (mut mn, mut mx, mut bad) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
            for &v in c {
                let v: f64 = v.into();
                mn = if v < mn { v } else { mn };
                mx = if v > mx { v } else { mx };
                bad += zero_if_finite(v);
            }
            (mn, mx, bad)
        })
        .reduce(
            || (f64::INFINITY, f64::NEG_INFINITY, 0.0),
            |a, b| (a.0.min(b.0), a.1.max(b.1), a.2 + b.2),
        );
    if bad != 0.0 {
        let i = x.iter().position(|&v| !v.into().is_finite()).unwrap_or(0);
        return Err(QuantError::arg(format!(
            "{what}: non-finite value {} at index {i}",
            x[i].into()
        )));
    }
    Ok((mn, mx))
}

/// Linear-interpolated quantile of `v` (NumPy's default method); reorders `v`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let t = pos - lo as f64;
    let (_, &mut a, rest) = v.select_nth_unstable_by(lo, f64::total_cmp);
    if t == 0.0 {
        return a;
    }
    let b = rest.iter().copied().fold(f64::INFINITY, f64::min);
    a + (b - a) * t
}

/// Per-tensor calibration of `x`. With `clip_fraction == 0` this is exact
/// min/max (or absmax); otherwise percentile calibration.
pub fn calibrate<T: Copy + Into<f64> + Sync>(
    x: &[T],
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<QuantParams> {
    if !(0.0..0.5).contains(&clip_fraction) {
        return Err(QuantError::arg(format!(
            "clip_fraction: expected a value in [0, 0.5), got {clip_fraction}"
        )));
    }
    let (mn, mx) = finite_minmax(x, "x")?;
    if clip_fraction == 0.0 {
        return QuantParams::from_minmax(mn, mx, dtype, scheme);
    }
    match scheme {
        QuantScheme::Symmetric => {
            let mut a: Vec<f64> = x.iter().map(|&v| v.into().abs()).collect();
            QuantParams::from_absmax(quantile(&mut a, 1.0 - clip_fraction), dtype)
        }
        QuantScheme::Affine => {
            let mut a: Vec<f64> = x.iter().map(|&v| v.into()).collect();
            let lo = quantile(&mut a, clip_fraction);
            let hi = quantile(&mut a, 1.0 - clip_fraction);
            QuantParams::from_minmax(lo, hi, dtype, scheme)
        }
    }
}

/// Calibrate each channel of a row-major `[rows, cols]` tensor; `axis` is
/// the channel axis (0: one quantizer per row, 1: one per column).
pub fn calibrate_per_channel<T: Copy + Into<f64> + Sync + Send>(
    x: &[T],
    shape: [usize; 2],
    axis: usize,
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<Vec<QuantParams>> {
    let [rows, cols] = shape;
    if rows * cols != x.len() {
        return Err(QuantError::dims("x", rows * cols, x.len()));
    }
    if axis > 1 {
        return Err(QuantError::arg(format!(
            "axis: expected 0 or 1 for a 2-D tensor, got {axis}"
        )));
    }
    let channels = if axis == 0 { rows } else { cols };
    (0..channels)
        .into_par_iter()
        .map(|c| {
            let ch: Vec<T> = if axis == 0 {
                x[c * cols..(c + 1) * cols].to_vec()
            } else {
                (0..rows).map(|r| x[r * cols + c]).collect()
            };
            calibrate(&ch, dtype, scheme, clip_fraction)
                .map_err(|e| QuantError::arg(format!("channel {c} (axis {axis}): {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_vectors() {
        let p = QuantParams::from_absmax(12.7, IntDtype::Int8).unwrap();
        assert!((p.scale - 0.1).abs() < 1e-15);
        assert_eq!((p.zero_point, p.qmin, p.qmax), (0, -127, 127));
        let p = QuantParams::from_absmax(7.0, IntDtype::Int4).unwrap();
        assert_eq!(p.scale, 1.0);
        assert!(QuantParams::from_absmax(0.0, IntDtype::Int8).is_err());
    }

    #[test]
    fn affine_includes_zero() {
        let p = QuantParams::from_minmax(1.0, 3.0, IntDtype::Int8, QuantScheme::Affine).unwrap();
        assert_eq!(p.scale, 3.0 / 255.0);
        assert_eq!(p.zero_point, -128);
        let p = QuantParams::from_minmax(-2.0, -1.0, IntDtype::Int4, QuantScheme::Affine).unwrap();
        assert_eq!(p.zero_point, 7);
    }

    #[test]
    fn quantile_matches_numpy_linear() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&mut v, 0.5), 2.5);
        assert_eq!(quantile(&mut v, 1.0), 4.0);
        assert_eq!(quantile(&mut v, 0.0), 1.0);
    }
}
