//! `quantrs._core.cuda_qat_calibrate`, behind `quantrs.cuda.calibrate`:
//! `quantrs.qat.calibrate` of a CUDA array (`gpu::qat_channels`).

use pyo3::prelude::*;

use super::array::DType;
use super::device::gpu;
use super::input::{cuda_ordinal, device_input, is_cuda_array};
use crate::gpu::qat_channels;
use crate::python::errors::invalid;
use crate::python::qat::{int_dtype, scheme_arg, target_arg, PyQuantParams};
use crate::qat::QuantParams;

/// Integer quantization parameters of the CUDA array `x` (float32 or
/// float64), as `quantrs.qat.calibrate`: per tensor, or per channel along
/// `axis` of a 2-D `x`. Min / max reduce on the device; percentile
/// calibration (`clip_fraction > 0`) and error reports read a host copy.
#[pyfunction]
#[pyo3(name = "cuda_qat_calibrate", signature = (x, target, scheme, clip_fraction, axis = None))]
fn calibrate(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    target: &Bound<'_, PyAny>,
    scheme: &Bound<'_, PyAny>,
    clip_fraction: f64,
    axis: Option<usize>,
) -> PyResult<Py<PyAny>> {
    let dtype = int_dtype(target_arg(target)?, "calibration")?;
    let scheme = scheme_arg(scheme)?;
    if !is_cuda_array(x)? {
        return Err(invalid(
            "x",
            "expected a CUDA array (DeviceArray, torch.cuda tensor, CuPy array)",
        ));
    }
    let g = gpu(py, cuda_ordinal(x)?)?;
    // float32 first; anything else must be float64 (the error says so).
    let (xi, f64_input) = match device_input(&g, x, "x", DType::F32, "the call") {
        Ok(d) => (d, false),
        Err(_) => (device_input(&g, x, "x", DType::F64, "the call")?, true),
    };
    let shape = xi.shape.clone();
    let wrap = |v: QuantParams| PyQuantParams::wrap(v);
    match axis {
        None => {
            let r = if f64_input {
                let x = xi.view::<f64>()?;
                py.detach(|| qat_channels::calibrate(&x, dtype, scheme, clip_fraction))?
            } else {
                let x = xi.view::<f32>()?;
                py.detach(|| qat_channels::calibrate(&x, dtype, scheme, clip_fraction))?
            };
            Ok(Py::new(py, wrap(r))?.into_any())
        }
        Some(axis) => {
            if shape.len() != 2 {
                return Err(invalid(
                    "x",
                    format!("per-channel calibration needs a 2-D array, got shape {shape:?}"),
                ));
            }
            let s = [shape[0], shape[1]];
            let r = if f64_input {
                let x = xi.view::<f64>()?;
                py.detach(|| {
                    qat_channels::calibrate_per_channel(&x, s, axis, dtype, scheme, clip_fraction)
                })?
            } else {
                let x = xi.view::<f32>()?;
                py.detach(|| {
                    qat_channels::calibrate_per_channel(&x, s, axis, dtype, scheme, clip_fraction)
                })?
            };
            let list: Vec<PyQuantParams> = r.into_iter().map(wrap).collect();
            Ok(list.into_pyobject(py)?.into_any().unbind())
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(calibrate, m)?)?;
    Ok(())
}
