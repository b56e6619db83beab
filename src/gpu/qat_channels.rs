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
use super::memory::{to_host, DeviceBuffer};
use super::nvrtc::QAT;
use super::ops::launch;
use super::qat::{DevMaster, THREADS};
use crate::error::{QuantError, Result};
use crate::qat::{calibrate, calibrate_per_channel, IntDtype, QuantParams, QuantScheme};

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

/// `qat_channel_minmax_*` over a row-major `[rows, cols]` tensor at `x`:
/// one triple per channel along `axis`, on the host.
fn channel_minmax<T: DevMaster>(
    gpu: &Arc<Gpu>,
    x: u64,
    [rows, cols]: [usize; 2],
    axis: usize,
) -> Result<Vec<f64>> {
    let channels = if axis == 0 { rows } else { cols };
    let out = DeviceBuffer::alloc(gpu, 24 * channels)?;
    let name = if T::SUFFIX == "f32" {
        "qat_channel_minmax_f32"
    } else {
        "qat_channel_minmax_f64"
    };
    let f = gpu.function(&QAT, name)?;
    let (mut xp, mut r, mut c, mut ax, mut op) =
        (x, rows as u64, cols as u64, axis as i32, out.ptr());
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
    to_host::<f64>(gpu, out.ptr(), 3 * channels)
}

/// `calibrate_per_channel` of the device array at `x` (`T` elements).
#[allow(clippy::too_many_arguments)]
pub(crate) fn per_channel<T: DevMaster>(
    gpu: &Arc<Gpu>,
    x: u64,
    shape: [usize; 2],
    axis: usize,
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<Vec<QuantParams>> {
    let n = shape[0] * shape[1];
    if axis <= 1 && n > 0 && clip_fraction == 0.0 {
        let t = channel_minmax::<T>(gpu, x, shape, axis)?;
        if let Some(p) = params_from_minmax(&t, dtype, scheme, axis)? {
            return Ok(p);
        }
    }
    let host = to_host::<T>(gpu, x, n)?;
    calibrate_per_channel(&host, shape, axis, dtype, scheme, clip_fraction)
}

/// Elements per channel when a flat tensor is reduced as `[n / L, L]`.
const ROW: usize = 4096;

/// `calibrate` (per tensor) of the device array at `x` of `n` elements:
/// min / max over rows of `ROW` elements and the tail, folded here.
pub(crate) fn per_tensor<T: DevMaster>(
    gpu: &Arc<Gpu>,
    x: u64,
    n: usize,
    dtype: IntDtype,
    scheme: QuantScheme,
    clip_fraction: f64,
) -> Result<QuantParams> {
    if n > 0 && clip_fraction == 0.0 {
        let rows = n / ROW;
        let mut t = channel_minmax::<T>(gpu, x, [rows, ROW], 0)?;
        let tail = n - rows * ROW;
        if tail > 0 {
            let at = x + (rows * ROW * T::BYTES) as u64;
            t.extend(channel_minmax::<T>(gpu, at, [1, tail], 0)?);
        }
        let (mn, mx, bad) = super::qat::reduce_partials(&t);
        if !bad {
            return QuantParams::from_minmax(mn, mx, dtype, scheme);
        }
    }
    let host = to_host::<T>(gpu, x, n)?;
    calibrate(&host, dtype, scheme, clip_fraction)
}
