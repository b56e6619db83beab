//! `quantrs.PerTensorFP8Linear`, `UnquantLinear`, `Int8Linear`, `Int4Linear`
//! and `QuantLinear` (any registered format): the `QuantMethod` layers
//! (docs/linear.md).
//!
//! The five classes are declared here, with `wrap` (a core layer -> its
//! Python class), because every layer's methods may return any of them
//! (`apply_isq`, `add_delta_w`, `deserialize`). One way down from there:
//! `fp8.rs`, `isq.rs` and `generic.rs` (each family's constructors and own properties)
//! -> `py_layer.rs` (the `#[pymethods]` block every class shares) ->
//! `base.rs` (those methods' bodies) -> `convert.rs` (argument
//! conversion), and this file.

mod base;
mod convert;
mod fp8;
mod generic;
mod grad;
mod isq;
mod py_layer;

use std::sync::Arc;

use pyo3::prelude::*;

use super::gpu::CudaLayer;
use crate::linear::{
    Int4Linear, Int8Linear, Layer, PerTensorFP8Linear, QuantMethod, UnquantLinear,
};

/// A linear layer in any registered weight format, built from a float
/// weight and a format name (`QuantLinear(w, "int8")`); the layers of
/// formats without a class of their own are of this class.
#[pyclass(name = "QuantLinear", module = "quantrs", frozen)]
pub struct PyQuantLinear {
    inner: Arc<dyn QuantMethod>,
    /// The device copy `forward` runs on (None: on the host).
    cuda: Option<CudaLayer>,
}

/// Per-tensor FP8 (E4M3) linear layer: weight codes `[out, in]` (or
/// expert-stacked `[E, out, in]`), `W = decode(weight) * weight_scale_inv`,
/// optional static `activation_scale` (W8A8 forward) and float32 bias.
#[pyclass(name = "PerTensorFP8Linear", module = "quantrs", frozen)]
pub struct PyFp8Linear {
    inner: Arc<PerTensorFP8Linear>,
    /// The device copy `forward` runs on (None: on the host).
    cuda: Option<CudaLayer>,
}

/// Unquantized float32 linear layer, weight `[out, in]`.
#[pyclass(name = "UnquantLinear", module = "quantrs", frozen)]
pub struct PyUnquantLinear {
    inner: Arc<UnquantLinear>,
    /// The device copy `forward` runs on (None: on the host).
    cuda: Option<CudaLayer>,
}

/// int8 linear layer, per-output-row symmetric absmax scales.
#[pyclass(name = "Int8Linear", module = "quantrs", frozen)]
pub struct PyInt8Linear {
    inner: Arc<Int8Linear>,
    /// The device copy `forward` runs on (None: on the host).
    cuda: Option<CudaLayer>,
}

/// INT4 linear layer over a `QuantizedWeight` (`[in, out]`, groups along in).
#[pyclass(name = "Int4Linear", module = "quantrs", frozen)]
pub struct PyInt4Linear {
    inner: Arc<Int4Linear>,
    /// The device copy `forward` runs on (None: on the host).
    cuda: Option<CudaLayer>,
}

/// The Python object for a layer, by concrete type.
pub(crate) fn wrap(py: Python<'_>, layer: Arc<dyn QuantMethod>) -> PyResult<Py<PyAny>> {
    Ok(match layer.into_layer() {
        Layer::Fp8(inner) => Py::new(py, PyFp8Linear { inner, cuda: None })?.into_any(),
        Layer::Unquant(inner) => Py::new(py, PyUnquantLinear { inner, cuda: None })?.into_any(),
        Layer::Int8(inner) => Py::new(py, PyInt8Linear { inner, cuda: None })?.into_any(),
        Layer::Int4(inner) => Py::new(py, PyInt4Linear { inner, cuda: None })?.into_any(),
        Layer::Registered { layer, .. } => Py::new(
            py,
            PyQuantLinear {
                inner: layer,
                cuda: None,
            },
        )?
        .into_any(),
    })
}

/// The GPU placement of `obj` when it is a layer on a device.
#[cfg(feature = "gpu")]
pub(crate) fn cuda_layer<'a>(obj: &'a Bound<'_, PyAny>) -> Option<&'a CudaLayer> {
    if let Ok(l) = obj.cast::<PyFp8Linear>() {
        return l.get().cuda.as_ref();
    }
    if let Ok(l) = obj.cast::<PyUnquantLinear>() {
        return l.get().cuda.as_ref();
    }
    if let Ok(l) = obj.cast::<PyInt8Linear>() {
        return l.get().cuda.as_ref();
    }
    if let Ok(l) = obj.cast::<PyQuantLinear>() {
        return l.get().cuda.as_ref();
    }
    obj.cast::<PyInt4Linear>().ok()?.get().cuda.as_ref()
}

/// Add the layer classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFp8Linear>()?;
    m.add_class::<PyUnquantLinear>()?;
    m.add_class::<PyInt8Linear>()?;
    m.add_class::<PyInt4Linear>()?;
    m.add_class::<PyQuantLinear>()?;
    Ok(())
}
