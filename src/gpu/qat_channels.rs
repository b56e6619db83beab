//! Calibration of device arrays (CPU twins: `qat::calibrate`,
//! `qat::calibrate_per_channel`). Min / max calibration reduces on the
//! device (`qat_channel_minmax_*`, one (min, max, non-finite) triple per
//! channel, order-independent) and turns the triples into parameters with
//! the CPU's `QuantParams::from_minmax`, so the result is the CPU's.
//! Percentile calibration (quantile selection) and every error path read a
//! host copy and run the CPU function itself: the same result and the
//! same error message by construction.

use std::ffi::c_void;
use std::sync::Arc;

use super::context::Gpu;
use super::memory::{DeviceBuffer, DeviceSlice};
use super::nvrtc::QAT;
use super::ops::launch;
use super::qat::{DevMaster, THREADS};
use crate::error::{QuantError, Result};
use crate::qat::{IntDtype, QuantParams, QuantScheme};

/// Per-channel parameters from the kernel's triples (channel `c` at
/// `3 * c`); `None` when a channel holds a NaN or an infinity (the caller
/// then reports it from a host copy, as the CPU does).
pub(crate) fn params_from_minmax(
    triples: &[f64],
    dtype: IntDtype,
    scheme: QuantScheme,
    axis: usize,
) -> Result<Option<Vec<QuantParams>>> {
    if triples.chunks_exact(3).any(|t| t[2] != 0.0) {
        return Ok(None);
    }
    triples
        .chunks_exact(3)
        .enumerate()
        .map(|(c, t)| {
            QuantParams::from_minmax(t[0], t[1], dtype, scheme)
                .map_err(|e| QuantError::arg(format!("channel {c} (axis {axis}): {e}")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `qat_channel_minmax_*` over the row-major `[rows, cols]` tensor `x`
/// (`rows * cols` elements, checked by the callers): one triple per
/// channel along `axis` (0 or 1), on the host.
fn channel_minmax<T: DevMaster>(
    x: &DeviceSlice<'_, T>,
    [rows, cols]: [usize; 2],
    axis: usize,
) -> Result<Vec<f64>> {
    let gpu: &Arc<Gpu> = x.gpu();
    if rows * cols != x.len() || axis > 1 {
        return Err(QuantError::dims("x", rows * cols, x.len()));
    }
    let channels = if axis == 0 { rows } else { cols };
    let out = DeviceBuffer::alloc(gpu, 24 * channels)?;
    let name = if T::SUFFIX == "f32" {
        "qat_channel_minmax_f32"
    } else {
        "qat_channel_minmax_f64"
    };
    let f = gpu.function(&QAT, name)?;
    let (mut xp, mut r, mut c, mut ax, mut op) =
        (x.ptr(), rows as u64, cols as u64, axis as i32, out.ptr());
    // SAFETY: `qat_channel_minmax_*(const T* x, u64 rows, u64 cols, int
    // axis, double* out)` reads the `rows * cols` elements of `x` (checked
    // above) and writes 3 f64 per channel into `out` (sized so).
    unsafe {
        launch(
            gpu,
            f,
            (channels.div_ceil(THREADS), 1),
            THREADS as u32,
            &mut [
                &mut xp as *mut _ as *mut c_void,
                &mut r as *mut _ as *mut c_void,
                &mut c as *mut _ as *mut c_void,
                &mut ax as *mut _ as *mut c_void,
                &mut op as *mut _ as *mut c_void,
            ],
        )?;
    }
    out.to_host::<f64>()
}

/// `qat::calibrate_per_channel` of the row-major `[rows, cols]` device
/// array `x` (the same parameters and errors as the CPU function).
pub fn calibrate_per_channel<T: DevMaster>(
    x: &DeviceSlice<'_, T>,
    shape: [usize; 2],
    axis: usize,
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<Vec<QuantParams>> {
    let n = shape[0] * shape[1];
    if axis <= 1 && n > 0 && n == x.len() && clip_fraction == 0.0 {
        let t = channel_minmax::<T>(x, shape, axis)?;
        if let Some(p) = params_from_minmax(&t, dtype, scheme, axis)? {
            return Ok(p);
        }
    }
    crate::qat::calibrate_per_channel(&x.to_host()?, shape, axis, dtype, scheme, clip_fraction)
}

/// Elements per channel when a flat tensor is reduced as `[n / L, L]`.
const ROW: usize = 4096;

/// `qat::calibrate` (per tensor) of the device array `x`: min / max over
/// rows of `ROW` elements and the tail, folded here (the same parameters
/// and errors as the CPU function).
pub fn calibrate<T: DevMaster>(
    x: &DeviceSlice<'_, T>,
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<QuantParams> {
    let n = x.len();
    if n > 0 && clip_fraction == 0.0 {
        let rows = n / ROW;
        let mut t = channel_minmax::<T>(&x.sub(0, rows * ROW)?, [rows, ROW], 0)?;
        let tail = n - rows * ROW;
        if tail > 0 {
            t.extend(channel_minmax::<T>(&x.sub(rows * ROW, tail)?, [1, tail], 0)?);
        }
        let (mn, mx, bad) = super::qat::reduce_partials(&t);
        if !bad {
            return QuantParams::from_minmax(mn, mx, dtype, scheme);
        }
    }
    crate::qat::calibrate(&x.to_host()?, dtype, scheme, clip_fraction)
}
