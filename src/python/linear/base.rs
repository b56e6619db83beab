//! What the four layer classes share: the methods of the `QuantMethod`
//! surface, written once as functions over the core trait (bound into each
//! class by `py_layer!`, in `py_layer.rs`).

use std::borrow::Cow;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use numpy::{PyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::convert::{
    bias_shape, bytes_of, indices_of, new_f32, opt_bias, opt_f32_shaped, parse_device,
};
use super::wrap;
use crate::error::QuantError;
use crate::linear::{Device, IsqType, QuantMethod, QuantizedSerde, ReadLayer};
use crate::python::arrays::{input, numpy_module};
use crate::python::errors::{invalid, wrong_dtype};

/// `forward` on float32 activations `[..., in]` -> `[..., out]`: the crate's
/// ndarray `QuantMethod::forward` on a zero-copy view of `x` (it checks the
/// shape); its result moves into NumPy without a copy.
pub(super) fn forward_f32<'py>(
    layer: &dyn QuantMethod,
    x: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let xa = input::<f32>(x, "x")?;
    let xv = xa.as_array();
    let y = py.detach(|| layer.forward(xv))?;
    Ok(PyArrayDyn::from_owned_array(py, y).into_any())
}

/// float16 / float32 / float64 / bfloat16 in, the same dtype out.
pub(super) fn autocast<'py>(
    x: &Bound<'py, PyAny>,
    f: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let arr = match x.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => numpy_module(py)?
            .call_method1("asarray", (x,))?
            .cast_into::<PyUntypedArray>()?,
    };
    let dt = arr.dtype();
    let name = dt.str()?.to_string();
    let name = name.trim_start_matches(['<', '>', '=', '|']).to_string();
    let dtype_name: String = dt.getattr("name")?.extract()?;
    match dtype_name.as_str() {
        "float32" => f(arr.as_any()),
        "float16" | "float64" | "bfloat16" => {
            let x32 = arr.call_method1("astype", ("float32",))?;
            let y = f(&x32)?;
            y.call_method1("astype", (arr.dtype(),))
        }
        _ => Err(wrong_dtype(
            "x",
            "float16, float32, float64 or bfloat16",
            format!("{dtype_name} ({name})"),
        )),
    }
}

/// `gather_forward` on float32 `x [tokens, in]` and `indices [tokens, k]`.
pub(super) fn gather_f32<'py>(
    layer: &dyn QuantMethod,
    x: &Bound<'py, PyAny>,
    indices: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let xa = input::<f32>(x, "x")?;
    let ia = indices_of(indices)?;
    let inf = layer.in_features();
    // Named per argument here (the array API reports both shapes at once).
    if xa.ndim() != 2 || xa.shape()[1] != inf {
        return Err(
            QuantError::dims("x", format!("[tokens, {inf}]"), format!("{:?}", xa.shape())).into(),
        );
    }
    if ia.ndim() != 2 || ia.shape()[0] != xa.shape()[0] {
        return Err(QuantError::dims(
            "indices",
            format!("[{}, k]", xa.shape()[0]),
            format!("{:?}", ia.shape()),
        )
        .into());
    }
    let (xv, iv) = (xa.as_array(), ia.as_array());
    let y = py.detach(|| layer.gather_forward(xv, iv))?;
    Ok(PyArrayDyn::from_owned_array(py, y).into_any())
}

/// An optional bias vector of `layer` as a float32 array.
fn bias_array<'py>(
    py: Python<'py>,
    layer: &dyn QuantMethod,
    b: Option<Vec<f32>>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let shape = layer.weight_shape();
    b.map(|b| new_f32(py, b, bias_shape(&shape))).transpose()
}

/// `dequantize_w()`.
pub(super) fn dequantize_w<'py>(
    py: Python<'py>,
    layer: &dyn QuantMethod,
) -> PyResult<Bound<'py, PyAny>> {
    let w = py.detach(|| layer.dequantize_w())?;
    Ok(PyArrayDyn::from_owned_array(py, w).into_any())
}

/// A weight and optional bias as float32 arrays.
pub(super) type WeightBias<'py> = (Bound<'py, PyAny>, Option<Bound<'py, PyAny>>);

/// `unquant_weight_bias()`.
pub(super) fn unquant_weight_bias<'py>(
    py: Python<'py>,
    layer: &dyn QuantMethod,
) -> PyResult<WeightBias<'py>> {
    let (w, b) = py
        .detach(|| layer.unquant_weight_bias())
        .ok_or_else(|| QuantError::UnsupportedOperation("no unquantized weight".into()))?;
    let w = new_f32(py, w, &layer.weight_shape())?;
    Ok((w, bias_array(py, layer, b)?))
}

/// `add_delta_w(delta)`.
pub(super) fn add_delta_w(
    py: Python<'_>,
    layer: &dyn QuantMethod,
    delta: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let d = input::<f32>(delta, "delta")?;
    let dv = d.as_array();
    let out = py.detach(|| layer.add_delta_w(dv))?;
    wrap(py, out)
}

/// `apply_isq(dtype, device, imatrix_weight, group_size=)`.
pub(super) fn apply_isq(
    py: Python<'_>,
    layer: Arc<dyn QuantMethod>,
    dtype: Option<&str>,
    device: &str,
    imatrix_weight: Option<&Bound<'_, PyAny>>,
    group_size: usize,
) -> PyResult<Py<PyAny>> {
    let target = match dtype {
        None => None,
        Some(s) => Some(IsqType::parse(s, group_size).ok_or_else(|| {
            invalid(
                "dtype",
                format!(
                    "expected one of {} or None, got {s:?}",
                    super::convert::format_names(true)
                ),
            )
        })?),
    };
    let device = parse_device(device)?;
    let im = opt_f32_shaped(imatrix_weight, "imatrix_weight", &[&[layer.in_features()]])?;
    let counter = AtomicUsize::new(0);
    // Quantized on the CPU, then placed on the device by the class's `to`.
    let out = py.detach(|| layer.apply_isq(target, Device::Cpu, &counter, im))?;
    let cpu = wrap(py, out)?;
    match device {
        Device::Cpu => Ok(cpu),
        Device::Cuda(_) => Ok(cpu.bind(py).call_method1("to", (device.name(),))?.unbind()),
    }
}

/// `end_track_stats()`.
pub(super) fn end_track_stats<'py>(
    py: Python<'py>,
    layer: &dyn QuantMethod,
) -> PyResult<Bound<'py, PyAny>> {
    let v = layer.end_track_stats()?;
    let n = v.len();
    new_f32(py, v, &[n])
}

/// The `bias` property: a copy, or None.
pub(super) fn bias<'py>(
    py: Python<'py>,
    layer: &dyn QuantMethod,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    bias_array(py, layer, layer.bias().map(<[f32]>::to_vec))
}

/// `serialize_with_bias(bias)`.
pub(super) fn serialize_with_bias<'py, L: QuantizedSerde + QuantMethod + ?Sized>(
    py: Python<'py>,
    layer: &L,
    bias: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let b = opt_bias(bias, &layer.weight_shape())?;
    let bytes = layer.serialize_with_bias(b)?;
    Ok(PyBytes::new(py, &bytes))
}

/// `deserialize(data)` for the layer type `L`.
pub(super) fn deserialize<L: ReadLayer + ?Sized>(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let d = bytes_of(data)?;
    let l = py.detach(|| L::read_layer(Cow::Borrowed(&d), &Device::Cpu))?;
    wrap(py, l)
}

/// A layer object and its bias (or None).
pub(super) type LayerBias<'py> = (Py<PyAny>, Option<Bound<'py, PyAny>>);

/// `deserialize_ext_bias(data)` for the layer type `L`.
pub(super) fn deserialize_ext_bias<'py, L: ReadLayer + ?Sized>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
) -> PyResult<LayerBias<'py>> {
    let d = bytes_of(data)?;
    let (l, b) = py.detach(|| L::read_layer_ext_bias(Cow::Borrowed(&d), &Device::Cpu))?;
    let bias = bias_array(py, &*l, b)?;
    Ok((wrap(py, l)?, bias))
}

/// `__reduce__`: `(cls.deserialize, (layer.serialize(),))`.
pub(super) fn reduce<'py, L: QuantizedSerde + ?Sized>(
    cls: &Bound<'py, pyo3::types::PyType>,
    layer: &L,
) -> PyResult<Bound<'py, PyTuple>> {
    let py = cls.py();
    let ctor = cls.getattr("deserialize")?;
    let bytes = PyBytes::new(py, &layer.serialize()?);
    PyTuple::new(py, [ctor, PyTuple::new(py, [bytes])?.into_any()])
}

/// The error of a method that runs only on the host, for a layer placed on
/// CUDA device `ordinal`.
pub(super) fn host_only(what: &str, ordinal: usize) -> PyErr {
    crate::error::QuantError::UnsupportedOperation(format!(
        "{what} runs on the CPU, and this layer is on cuda:{ordinal} (use forward, or \
         move the layer with .to('cpu'))"
    ))
    .into()
}
