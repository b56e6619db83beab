//! `quantrs.cuda.CudaLinear`: what a linear layer's `.to("cuda")` and
//! `apply_isq(..., device="cuda")` return.

use std::borrow::Cow;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{device_input, output};
use crate::error::QuantError;
use crate::gpu::layers::DeviceLinear;
use crate::linear::{
    Device, Int4Linear, Int8Linear, Layer, PerTensorFP8Linear, QuantMethod, QuantizedSerde,
    UnquantLinear,
};

/// A linear layer on a GPU (`layer.to("cuda")`, `apply_isq(...,
/// device="cuda")`): `forward` on NumPy (copied in and out) or CUDA arrays
/// (zero-copy, a `DeviceArray` back). Pickling and `serialize` give the
/// CPU twin's bytes.
#[pyclass(name = "CudaLinear", module = "quantrs.cuda", frozen)]
pub struct CudaLinear {
    pub(super) inner: DeviceLinear,
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
        let xi = device_input(l.gpu(), x, "x", DType::F32, "the layer")?;
        if xi.shape.last() != Some(&l.in_features()) {
            return Err(QuantError::dims(
                "x",
                format!("[..., {}]", l.in_features()),
                format!("{:?}", xi.shape),
            )
            .into());
        }
        let rows = xi.shape[..xi.shape.len() - 1].iter().product();
        let mut out_shape = xi.shape.clone();
        *out_shape.last_mut().expect("rank >= 1") = l.out_features();
        let mut y = DeviceArray::empty(l.gpu(), out_shape, DType::F32)?;
        let xv = xi.view::<f32>()?;
        let mut yv = y.view_mut::<f32>()?;
        py.detach(|| {
            l.forward(&xv, rows, &mut yv)
                .and_then(|_| l.gpu().synchronize())
        })?;
        output(py, y, xi.from_host)
    }

    fn __call__(&self, x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.forward(x)
    }

    /// `(weight dtype, "cuda:N")`.
    fn dtype_and_device(&self) -> (&'static str, String) {
        (
            self.inner.dtype().name(),
            format!("cuda:{}", self.inner.gpu().ordinal),
        )
    }

    /// `"float8_e4m3fn"` when activations are quantized (W8A8), else None.
    fn quantized_act_type(&self) -> Option<&'static str> {
        match self.inner.weight() {
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
            Device::Cuda(i) if i == slf.get().inner.gpu().ordinal => Ok(slf.clone().into_any()),
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
        self.inner.in_features()
    }

    #[getter]
    fn out_features(&self) -> usize {
        self.inner.out_features()
    }

    #[getter]
    fn weight_shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [self.inner.out_features(), self.inner.in_features()])
    }

    /// Device bytes of weight, scales and bias.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.inner.gpu().ordinal)
    }

    fn __repr__(&self) -> String {
        format!(
            "CudaLinear({}, weight=<{} [{}, {}]>, device='cuda:{}')",
            self.class,
            self.inner.dtype().name(),
            self.inner.out_features(),
            self.inner.in_features(),
            self.inner.gpu().ordinal
        )
    }
}
