//! The module functions of `quantrs.cuda` (device FP8 codecs, device
//! queries, the NVRTC check, the benchmark helper) and the registration of
//! every GPU class and function in `_core`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{device_input, is_cuda_array, output, DevInput};
use crate::fp8::Fp8Format;
use crate::gpu::context::Gpu;
use crate::python::errors::invalid;

fn fmt_of(fmt: &str) -> PyResult<Fp8Format> {
    Fp8Format::parse(fmt)
        .ok_or_else(|| invalid("fmt", format!("expected 'e4m3' or 'e5m2', got {fmt:?}")))
}

/// A CUDA array argument of `dtype` (host arrays are refused: the device
/// codecs are for data already on a device) and its device.
fn cuda_only_input<'py>(
    x: &Bound<'py, PyAny>,
    arg: &str,
    dtype: DType,
) -> PyResult<(Arc<Gpu>, DevInput<'py>)> {
    if !is_cuda_array(x)? {
        return Err(invalid(
            arg,
            "expected a CUDA array (DeviceArray, torch.cuda tensor, CuPy array)",
        ));
    }
    let g = gpu(x.py(), super::input::cuda_ordinal(x)?)?;
    let input = device_input(&g, x, arg, dtype, "the call")?;
    Ok((g, input))
}

/// FP8 encode of a CUDA float32 array into uint8 codes on the same device
/// (bit-identical to `quantrs.fp8.encode`).
#[pyfunction]
#[pyo3(name = "cuda_fp8_encode", signature = (x, fmt = "e4m3", saturate = false))]
fn fp8_encode(x: &Bound<'_, PyAny>, fmt: &str, saturate: bool) -> PyResult<Py<PyAny>> {
    let py = x.py();
    let f = fmt_of(fmt)?;
    let (g, xi) = cuda_only_input(x, "x", DType::F32)?;
    let mut out = DeviceArray::empty(&g, xi.shape.clone(), DType::U8)?;
    let x = xi.view::<f32>()?;
    let mut o = out.view_mut::<u8>()?;
    py.detach(|| {
        crate::gpu::ops::fp8_encode(&x, &mut o, f, saturate).and_then(|_| g.synchronize())
    })?;
    output(py, out, false)
}

/// FP8 decode of CUDA uint8 codes into float32 on the same device
/// (bit-identical to `quantrs.fp8.decode`).
#[pyfunction]
#[pyo3(name = "cuda_fp8_decode", signature = (codes, fmt = "e4m3"))]
fn fp8_decode(codes: &Bound<'_, PyAny>, fmt: &str) -> PyResult<Py<PyAny>> {
    let py = codes.py();
    let f = fmt_of(fmt)?;
    let (g, ci) = cuda_only_input(codes, "codes", DType::U8)?;
    let mut out = DeviceArray::empty(&g, ci.shape.clone(), DType::F32)?;
    let c = ci.view::<u8>()?;
    let mut o = out.view_mut::<f32>()?;
    py.detach(|| crate::gpu::ops::fp8_decode(&c, &mut o, f).and_then(|_| g.synchronize()))?;
    output(py, out, false)
}

/// How many CUDA devices the driver sees (0 without a driver).
#[pyfunction]
#[pyo3(name = "cuda_device_count")]
fn device_count() -> usize {
    crate::gpu::context::device_count()
}

/// Why CUDA cannot be used, or None when device 0 can.
#[pyfunction]
#[pyo3(name = "cuda_unavailable_reason")]
fn unavailable_reason(py: Python<'_>) -> Option<String> {
    let _ = gpu(py, 0);
    crate::gpu::unavailable_reason()
}

/// Name, compute capability, memory and NVRTC version of a device.
#[pyfunction]
#[pyo3(name = "cuda_device_info", signature = (device = 0))]
fn device_info<'py>(py: Python<'py>, device: usize) -> PyResult<Bound<'py, PyDict>> {
    let g = gpu(py, device)?;
    let d = PyDict::new(py);
    d.set_item("name", &g.name)?;
    d.set_item("compute_capability", g.compute_capability)?;
    d.set_item("arch", g.arch())?;
    let (total, free) = g.memory_info()?;
    d.set_item("total_memory", total)?;
    d.set_item("free_memory", free)?;
    d.set_item("nvrtc_version", crate::gpu::nvrtc::version().ok())?;
    d.set_item("fp8_gemm", crate::gpu::caches::fp8_gemm_path(&g))?;
    Ok(d)
}

/// Compile every kernel source for `arch` ("sm_90") without a device and
/// return `{source name: PTX size}`; raises GpuError with NVRTC's log.
#[pyfunction]
#[pyo3(name = "_cuda_compile_all")]
fn compile_all<'py>(py: Python<'py>, arch: &str) -> PyResult<Bound<'py, PyDict>> {
    let _ = gpu(py, 0); // only to point at a pip-installed NVRTC
    let d = PyDict::new(py);
    for s in crate::gpu::nvrtc::SOURCES {
        let ptx =
            py.detach(|| crate::gpu::nvrtc::compile(s, arch, crate::gpu::nvrtc::Output::Ptx))?;
        d.set_item(s.name, ptx.len())?;
    }
    Ok(d)
}

/// Adds the GPU classes and functions to `_core` (`quantrs.cuda` re-exports them).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceArray>()?;
    super::qat_calibrate::register(m)?;
    m.add_function(wrap_pyfunction!(fp8_encode, m)?)?;
    m.add_function(wrap_pyfunction!(fp8_decode, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(compile_all, m)?)?;
    Ok(())
}
