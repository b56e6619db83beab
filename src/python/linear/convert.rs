//! Argument conversion for the layer classes: float32 and index arrays,
//! optional vectors, bytes, device names, and read-only views of a layer's
//! buffers. A leaf: no layer class is named here.

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};

use crate::error::QuantError;
use crate::format::FormatId;
use crate::linear::Device;
use crate::python::arrays::input;
use crate::python::errors::{invalid, wrong_dtype};

/// A new float32 array of `shape` owning `v`.
pub(super) fn new_f32<'py>(
    py: Python<'py>,
    v: Vec<f32>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, v)
        .reshape(shape.to_vec())?
        .into_any())
}

/// A read-only NumPy view of `buf` (owned by the frozen layer `owner`),
/// reshaped to `shape`; the array's base keeps `owner` alive.
pub(super) fn view_of<'py, T: numpy::Element>(
    owner: &Bound<'py, PyAny>,
    buf: &[T],
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let view = numpy::ndarray::ArrayView1::from(buf);
    // SAFETY: `buf` lives in an `Arc`'d layer held by the frozen pyclass
    // `owner`, which is never mutated after construction; the array's base
    // keeps `owner` (and so the buffer) alive as long as the view exists.
    let arr = unsafe { PyArray1::borrow_from_array(&view, owner.clone()) };
    arr.readwrite().make_nonwriteable();
    Ok(arr.reshape(shape.to_vec())?.into_any())
}

/// An optional float32 argument as a vector (None stays None).
pub(super) fn opt_f32_vec(obj: Option<&Bound<'_, PyAny>>, arg: &str) -> PyResult<Option<Vec<f32>>> {
    obj.filter(|o| !o.is_none())
        .map(|o| {
            input::<f32>(o, arg)
                .and_then(|a| Ok(a.as_slice().map_err(|e| invalid(arg, e))?.to_vec()))
        })
        .transpose()
}

/// A float32 argument whose shape must be one of `accepted` (a bias
/// `(out,)`, per-row scales `(out,)` or `(out, 1)`), as a flat vector; any
/// other shape, even of the right size (`(1, 1, out)`), is a
/// `DimensionMismatch` naming the argument (docs/errors.md, "Shapes").
/// None stays None.
pub(super) fn opt_f32_shaped(
    obj: Option<&Bound<'_, PyAny>>,
    arg: &str,
    accepted: &[&[usize]],
) -> PyResult<Option<Vec<f32>>> {
    let Some(o) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let a = input::<f32>(o, arg)?;
    if !accepted.iter().any(|s| a.shape() == *s) {
        let expected: Vec<String> = accepted.iter().map(|s| format!("{s:?}")).collect();
        return Err(
            QuantError::dims(arg, expected.join(" or "), format!("{:?}", a.shape())).into(),
        );
    }
    Ok(Some(a.as_slice().map_err(|e| invalid(arg, e))?.to_vec()))
}

/// The one shape a bias of a weight of `weight_shape` has: the weight's
/// shape without its input axis (`(out,)`, or `(E, out)` for stacked
/// experts). `None` for a weight of another rank, which the layer refuses.
pub(super) fn bias_shape_for(weight_shape: &[usize]) -> Option<Vec<usize>> {
    matches!(weight_shape.len(), 2 | 3).then(|| bias_shape(weight_shape).to_vec())
}

/// An optional bias for a weight of `weight_shape` (see `bias_shape_for`).
pub(super) fn opt_bias(
    obj: Option<&Bound<'_, PyAny>>,
    weight_shape: &[usize],
) -> PyResult<Option<Vec<f32>>> {
    match bias_shape_for(weight_shape) {
        Some(s) => opt_f32_shaped(obj, "bias", &[&s]),
        None => opt_f32_vec(obj, "bias"),
    }
}

/// A float32 weight argument whose rank is one of `rank`, with its shape.
pub(super) fn float_weight<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    rank: &[usize],
) -> PyResult<(PyReadonlyArrayDyn<'py, f32>, Vec<usize>)> {
    let a = input::<f32>(obj, arg)?;
    let shape = a.shape().to_vec();
    if !rank.contains(&shape.len()) {
        return Err(
            QuantError::dims(format!("{arg} rank"), format!("{rank:?}"), shape.len()).into(),
        );
    }
    a.as_slice().map_err(|e| invalid(arg, e))?;
    Ok((a, shape))
}

/// The contiguous data of an array `float_weight` returned (read in place:
/// the layer constructors quantize straight from NumPy's memory).
pub(super) fn weight_slice<'a>(
    a: &'a PyReadonlyArrayDyn<'_, f32>,
    arg: &str,
) -> PyResult<&'a [f32]> {
    a.as_slice().map_err(|e| invalid(arg, e))
}

/// A device name: 'cpu', 'cuda' or 'cuda:N'.
pub(super) fn parse_device(device: &str) -> PyResult<Device> {
    Device::parse(device).ok_or_else(|| {
        invalid(
            "device",
            format!("expected 'cpu', 'cuda' or 'cuda:N', got {device:?}"),
        )
    })
}

/// Integer indices `[tokens, k]` (any integer dtype; floats are refused).
pub(super) fn indices_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArrayDyn<'py, i64>> {
    if let Ok(u) = obj.cast::<PyUntypedArray>() {
        if !matches!(u.dtype().kind(), b'i' | b'u') {
            return Err(wrong_dtype("indices", "an integer dtype", u.dtype()));
        }
    }
    input::<i64>(obj, "indices")
}

/// The bytes of a bytes, bytearray or memoryview argument. Anything else
/// (an int above all: `bytes(10**9)` would allocate a gigabyte of zeros) is a
/// `TypeError`.
pub(super) fn bytes_of(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = data.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if data.cast::<PyMemoryView>().is_ok() {
        let b = data.py().get_type::<PyBytes>().call1((data,))?;
        return Ok(b.cast::<PyBytes>()?.as_bytes().to_vec());
    }
    Err(crate::python::errors::wrong_type(
        "data",
        "bytes, bytearray or memoryview",
        data,
    ))
}

/// The shape of a bias: the weight's shape without its last axis.
pub(super) fn bias_shape(weight_shape: &[usize]) -> &[usize] {
    &weight_shape[..weight_shape.len() - 1]
}

/// A bias in a layer's repr: `<float32>` or `None`.
pub(super) fn bias_repr(bias: Option<&[f32]>) -> &'static str {
    if bias.is_some() {
        "<float32>"
    } else {
        "None"
    }
}

/// `'a', 'b', ...`: the registered format names, for error messages.
pub(super) fn format_names(skip_float32: bool) -> String {
    FormatId::ALL
        .iter()
        .filter(|id| !(skip_float32 && **id == FormatId::Float32))
        .map(|id| format!("'{}'", id.info().name))
        .collect::<Vec<_>>()
        .join(", ")
}
