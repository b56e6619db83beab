// Over 400 lines: both device classes and the module functions of
// quantrs.cuda; splitting the module functions out is a follow-up.
//! `quantrs.cuda.CudaQuantizedWeight` and `quantrs.cuda.CudaLinear`: what
//! `.to("cuda")` returns, plus the device FP8 codecs and the module
//! functions of `quantrs.cuda`.

use std::borrow::Cow;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::array::{device_input, gpu, is_cuda_array, output, DType, DeviceArray};
use crate::error::QuantError;
use crate::fp8::Fp8Format;
use crate::gpu::layers::{DeviceLinear, DeviceQuantizedWeight};
use crate::gpu::ops::Wait;
use crate::linear::{
    Device, Int4Linear, Int8Linear, Layer, PerTensorFP8Linear, QuantMethod, QuantizedSerde,
    UnquantLinear,
};
use crate::python::errors::invalid;
use crate::python::int4::PyQuantizedWeight;

/// Packed INT4 weights on a GPU (`QuantizedWeight.to("cuda")`). Pickling
/// and `to_bytes` give exactly the bytes of the CPU twin.
#[pyclass(name = "CudaQuantizedWeight", module = "quantrs.cuda", frozen)]
pub struct CudaQuantizedWeight {
    inner: DeviceQuantizedWeight,
}

/// `QuantizedWeight.to(device)`.
pub(crate) fn quantized_weight_to<'py>(
    slf: &Bound<'py, PyAny>,
    device: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    match super::parse_device(device)? {
        Device::Cpu => Ok(slf.clone()),
        Device::Cuda(i) => {
            let g = gpu(py, i)?;
            let w = slf.cast::<PyQuantizedWeight>()?;
            let cpu = &w.get().inner;
            let inner = py.detach(|| DeviceQuantizedWeight::from_cpu(&g, cpu))?;
            Ok(Bound::new(py, CudaQuantizedWeight { inner })?.into_any())
        }
    }
}

impl CudaQuantizedWeight {
    fn to_cpu(&self, py: Python<'_>) -> PyResult<PyQuantizedWeight> {
        Ok(PyQuantizedWeight {
            inner: py.detach(|| self.inner.to_cpu())?,
        })
    }

    fn run<'py>(&self, x: &Bound<'py, PyAny>, vector: bool) -> PyResult<Py<PyAny>> {
        let py = x.py();
        let w = &self.inner;
        let xi = device_input(w.gpu(), x, "x", DType::F32, "the weight")?;
        let (batch, out_shape) = if vector {
            if xi.shape != [w.in_feat] {
                return Err(QuantError::dims(
                    "x",
                    format!("[{}]", w.in_feat),
                    format!("{:?}", xi.shape),
                )
                .into());
            }
            (1, vec![w.out_feat])
        } else {
            if xi.shape.len() != 2 || xi.shape[1] != w.in_feat {
                return Err(QuantError::dims(
                    "x",
                    format!("[batch, {}]", w.in_feat),
                    format!("{:?}", xi.shape),
                )
                .into());
            }
            (xi.shape[0], vec![xi.shape[0], w.out_feat])
        };
        let y = DeviceArray::empty(w.gpu(), out_shape, DType::F32)?;
        let (xp, yp) = (xi.ptr, y.buf.ptr());
        py.detach(|| w.matmul(xp, batch, 0, yp, Wait::Yes))?;
        output(py, y, xi.from_host)
    }
}

#[pymethods]
impl CudaQuantizedWeight {
    /// `y = W^T x`: `x [in_feat]` -> `[out_feat]`.
    fn matvec(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.run(x, true)
    }

    /// `Y = X W`: `x [batch, in_feat]` -> `[batch, out_feat]` (a tiled
    /// GEMM from batch 9 on, the split-K matvec below).
    fn matmul(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.run(x, false)
    }

    /// A copy on `device`: "cpu" gives a `QuantizedWeight`.
    fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        match super::parse_device(device)? {
            Device::Cpu => Ok(Bound::new(py, slf.get().to_cpu(py)?)?.into_any()),
            Device::Cuda(i) if i == slf.get().inner.gpu().ordinal => Ok(slf.clone().into_any()),
            Device::Cuda(i) => {
                let cpu = slf.get().to_cpu(py)?;
                let g = gpu(py, i)?;
                let inner = py.detach(|| DeviceQuantizedWeight::from_cpu(&g, &cpu.inner))?;
                Ok(Bound::new(py, CudaQuantizedWeight { inner })?.into_any())
            }
        }
    }

    /// The weight as a new float32 NumPy array `[in_feat, out_feat]`.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Bound::new(py, self.to_cpu(py)?)?.call_method0("dequantize")
    }

    /// The safetensors bytes of the CPU twin's `to_bytes`.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.to_cpu(py)?.inner.to_safetensors_bytes()?;
        Ok(PyBytes::new(py, &b))
    }

    /// Pickles as the CPU twin (same bytes); unpickling gives a CPU object.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Bound::new(py, self.to_cpu(py)?)?.call_method0("__reduce__")
    }

    #[getter]
    fn in_feat(&self) -> usize {
        self.inner.in_feat
    }

    #[getter]
    fn out_feat(&self) -> usize {
        self.inner.out_feat
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.num_groups
    }

    #[getter]
    fn group_size(&self) -> usize {
        self.inner.group_size()
    }

    /// Device bytes of packed data plus scales.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.inner.gpu().ordinal)
    }

    fn __repr__(&self) -> String {
        let w = &self.inner;
        format!(
            "CudaQuantizedWeight(in_feat={}, out_feat={}, num_groups={}, group_size={}, device='cuda:{}')",
            w.in_feat,
            w.out_feat,
            w.num_groups,
            w.group_size(),
            w.gpu().ordinal
        )
    }
}

/// A linear layer on a GPU (`layer.to("cuda")`, `apply_isq(...,
/// device="cuda")`): `forward` on NumPy (copied in and out) or CUDA arrays
/// (zero-copy, a `DeviceArray` back). Pickling and `serialize` give the
/// CPU twin's bytes.
#[pyclass(name = "CudaLinear", module = "quantrs.cuda", frozen)]
pub struct CudaLinear {
    inner: DeviceLinear,
    /// The CPU class name, e.g. "PerTensorFP8Linear".
    class: &'static str,
}

fn class_name(layer: &Layer) -> &'static str {
    match layer {
        Layer::Fp8(_) => "PerTensorFP8Linear",
        Layer::Unquant(_) => "UnquantLinear",
        Layer::Int8(_) => "Int8Linear",
        Layer::Int4(_) => "Int4Linear",
    }
}

fn layer_from_bytes(class: &str, bytes: &[u8]) -> crate::Result<Arc<dyn QuantMethod>> {
    let d = Cow::Borrowed(bytes);
    match class {
        "PerTensorFP8Linear" => PerTensorFP8Linear::deserialize(d, &Device::Cpu),
        "UnquantLinear" => UnquantLinear::deserialize(d, &Device::Cpu),
        "Int8Linear" => Int8Linear::deserialize(d, &Device::Cpu),
        "Int4Linear" => Int4Linear::deserialize(d, &Device::Cpu),
        other => Err(QuantError::UnsupportedOperation(format!(
            "{other} on a GPU"
        ))),
    }
}

/// A layer's `to(device)` (and `apply_isq(..., device=...)`): the layer's
/// `serialize()` bytes rebuild the core layer, which is copied to the device.
pub(crate) fn layer_to<'py>(
    slf: &Bound<'py, PyAny>,
    device: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    match super::parse_device(device)? {
        Device::Cpu => Ok(slf.clone()),
        Device::Cuda(i) => {
            let g = gpu(py, i)?;
            let class: String = slf.get_type().name()?.extract()?;
            let bytes = slf.call_method0("serialize")?;
            let bytes = bytes.cast::<PyBytes>()?.as_bytes();
            let layer = py.detach(|| layer_from_bytes(&class, bytes))?.into_layer();
            let class = class_name(&layer);
            let inner = py.detach(|| DeviceLinear::from_layer(&g, &layer))?;
            Ok(Bound::new(py, CudaLinear { inner, class })?.into_any())
        }
    }
}

impl CudaLinear {
    fn cpu_twin<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let l = py.detach(|| self.inner.to_cpu())?;
        Ok(crate::python::linear::wrap(py, l)?.into_bound(py))
    }
}

#[pymethods]
impl CudaLinear {
    /// `y = x @ W.T + bias` for float32 `x [..., in]`.
    fn forward(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let py = x.py();
        let l = &self.inner;
        let xi = device_input(&l.gpu, x, "x", DType::F32, "the layer")?;
        if xi.shape.last() != Some(&l.in_feat) {
            return Err(QuantError::dims(
                "x",
                format!("[..., {}]", l.in_feat),
                format!("{:?}", xi.shape),
            )
            .into());
        }
        let rows = xi.shape[..xi.shape.len() - 1].iter().product();
        let mut out_shape = xi.shape.clone();
        *out_shape.last_mut().expect("rank >= 1") = l.out_feat;
        let y = DeviceArray::empty(&l.gpu, out_shape, DType::F32)?;
        let (xp, yp) = (xi.ptr, y.buf.ptr());
        py.detach(|| l.forward(xp, rows, yp, Wait::Yes))?;
        output(py, y, xi.from_host)
    }

    fn __call__(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.forward(x)
    }

    /// `(weight dtype, "cuda:N")`.
    fn dtype_and_device(&self) -> (&'static str, String) {
        (
            self.inner.dtype().name(),
            format!("cuda:{}", self.inner.gpu.ordinal),
        )
    }

    /// `"float8_e4m3fn"` when activations are quantized (W8A8), else None.
    fn quantized_act_type(&self) -> Option<&'static str> {
        match self.inner.weight {
            crate::gpu::layers::DeviceWeight::Fp8 {
                activation_scale: Some(_),
                ..
            } => Some("float8_e4m3fn"),
            _ => None,
        }
    }

    /// A copy on `device`: "cpu" gives the CPU layer class.
    fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        match super::parse_device(device)? {
            Device::Cpu => slf.get().cpu_twin(py),
            Device::Cuda(i) if i == slf.get().inner.gpu.ordinal => Ok(slf.clone().into_any()),
            Device::Cuda(_) => layer_to(&slf.get().cpu_twin(py)?, device),
        }
    }

    /// The CPU twin's `serialize()` bytes.
    fn serialize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.cpu_twin(py)?.call_method0("serialize")
    }

    /// Pickles as the CPU twin (same bytes); unpickling gives a CPU layer.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.cpu_twin(py)?.call_method0("__reduce__")
    }

    /// The CPU class's layer name (as `serialize` records it).
    fn name<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.cpu_twin(py)?.call_method0("name")
    }

    #[getter]
    fn in_features(&self) -> usize {
        self.inner.in_feat
    }

    #[getter]
    fn out_features(&self) -> usize {
        self.inner.out_feat
    }

    #[getter]
    fn weight_shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [self.inner.out_feat, self.inner.in_feat])
    }

    /// Device bytes of weight, scales and bias.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.inner.gpu.ordinal)
    }

    fn __repr__(&self) -> String {
        format!(
            "CudaLinear({}, weight=<{} [{}, {}]>, device='cuda:{}')",
            self.class,
            self.inner.dtype().name(),
            self.inner.out_feat,
            self.inner.in_feat,
            self.inner.gpu.ordinal
        )
    }
}

fn fmt_of(fmt: &str) -> PyResult<Fp8Format> {
    Fp8Format::parse(fmt)
        .ok_or_else(|| invalid("fmt", format!("expected 'e4m3' or 'e5m2', got {fmt:?}")))
}

fn ordinal_of_array(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    super::array::cuda_ordinal(x)
}

/// FP8 encode of a CUDA float32 array into uint8 codes on the same device
/// (bit-identical to `quantrs.fp8.encode`).
#[pyfunction]
#[pyo3(name = "cuda_fp8_encode", signature = (x, fmt = "e4m3", saturate = false))]
fn fp8_encode(x: &Bound<'_, PyAny>, fmt: &str, saturate: bool) -> PyResult<Py<PyAny>> {
    let py = x.py();
    let f = fmt_of(fmt)?;
    if !is_cuda_array(x)? {
        return Err(invalid(
            "x",
            "expected a CUDA array (DeviceArray, torch.cuda tensor, CuPy array)",
        ));
    }
    let g = gpu(py, ordinal_of_array(x)?)?;
    let xi = device_input(&g, x, "x", DType::F32, "the call")?;
    let out = DeviceArray::empty(&g, xi.shape.clone(), DType::U8)?;
    let (xp, op, n) = (xi.ptr, out.buf.ptr(), out.len());
    py.detach(|| crate::gpu::ops::fp8_encode(&g, xp, op, n, f, saturate))?;
    output(py, out, false)
}

/// FP8 decode of CUDA uint8 codes into float32 on the same device
/// (bit-identical to `quantrs.fp8.decode`).
#[pyfunction]
#[pyo3(name = "cuda_fp8_decode", signature = (codes, fmt = "e4m3"))]
fn fp8_decode(codes: &Bound<'_, PyAny>, fmt: &str) -> PyResult<Py<PyAny>> {
    let py = codes.py();
    let f = fmt_of(fmt)?;
    if !is_cuda_array(codes)? {
        return Err(invalid(
            "codes",
            "expected a CUDA array (DeviceArray, torch.cuda tensor, CuPy array)",
        ));
    }
    let g = gpu(py, ordinal_of_array(codes)?)?;
    let ci = device_input(&g, codes, "codes", DType::U8, "the call")?;
    let out = DeviceArray::empty(&g, ci.shape.clone(), DType::F32)?;
    let (cp, op, n) = (ci.ptr, out.buf.ptr(), out.len());
    py.detach(|| crate::gpu::ops::fp8_decode(&g, cp, op, n, f))?;
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
    d.set_item("fp8_gemm", g.fp8_gemm_path())?;
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

/// Benchmark helper: queue `iters` calls of `obj` (a CudaQuantizedWeight's
/// matmul or a CudaLinear's forward) on the CUDA input `x` back to back,
/// after one warm-up, and return the mean seconds per call measured with
/// CUDA events (kernel time with launches pipelined; no host round trip).
#[pyfunction]
#[pyo3(name = "_cuda_bench")]
fn bench_calls(obj: &Bound<'_, PyAny>, x: &Bound<'_, PyAny>, iters: usize) -> PyResult<f64> {
    use cudarc::driver::{result as cu, sys};
    let py = obj.py();
    let iters = iters.max(1);
    let (g, in_feat, out_feat) = if let Ok(w) = obj.cast::<CudaQuantizedWeight>() {
        let w = &w.get().inner;
        (w.gpu().clone(), w.in_feat, w.out_feat)
    } else {
        let l = obj.cast::<CudaLinear>()?;
        let l = &l.get().inner;
        (l.gpu.clone(), l.in_feat, l.out_feat)
    };
    let xi = device_input(&g, x, "x", DType::F32, "the object")?;
    if xi.shape.len() != 2 || xi.shape[1] != in_feat {
        return Err(
            QuantError::dims("x", format!("[rows, {in_feat}]"), format!("{:?}", xi.shape)).into(),
        );
    }
    let rows = xi.shape[0];
    let y = DeviceArray::empty(&g, vec![rows, out_feat], DType::F32)?;
    let (xp, yp) = (xi.ptr, y.buf.ptr());
    let call = |wait: Wait| -> crate::Result<()> {
        if let Ok(w) = obj.cast::<CudaQuantizedWeight>() {
            w.get().inner.matmul(xp, rows, 0, yp, wait)
        } else {
            obj.cast::<CudaLinear>()
                .expect("checked above")
                .get()
                .inner
                .forward(xp, rows, yp, wait)
        }
    };
    call(Wait::Yes)?;
    g.bind()?;
    let ev = |what| {
        cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| crate::gpu::context::gpu_err(what, e))
    };
    let (start, end) = (ev("creating an event")?, ev("creating an event")?);
    let run = || -> crate::Result<f32> {
        // SAFETY: fresh events of the bound context, recorded on the null
        // stream around the queued calls, destroyed below.
        unsafe {
            cu::event::record(start, cu::stream::null())
                .map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            for _ in 0..iters {
                call(Wait::No)?;
            }
            cu::event::record(end, cu::stream::null())
                .map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            cu::event::synchronize(end).map_err(|e| crate::gpu::context::gpu_err("event", e))?;
            cu::event::elapsed(start, end).map_err(|e| crate::gpu::context::gpu_err("event", e))
        }
    };
    let r = run();
    let _ = g.synchronize();
    // SAFETY: created above, no longer recorded anywhere.
    unsafe {
        let _ = cu::event::destroy(start);
        let _ = cu::event::destroy(end);
    }
    let _ = py;
    Ok(f64::from(r?) * 1e-3 / iters as f64)
}

/// Adds the GPU classes and functions to `_core` (`quantrs.cuda` re-exports them).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DeviceArray>()?;
    m.add_class::<CudaQuantizedWeight>()?;
    m.add_class::<CudaLinear>()?;
    m.add_function(wrap_pyfunction!(fp8_encode, m)?)?;
    m.add_function(wrap_pyfunction!(fp8_decode, m)?)?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(compile_all, m)?)?;
    m.add_function(wrap_pyfunction!(bench_calls, m)?)?;
    Ok(())
}
