//! The FP8 layer family: `PerTensorFP8Linear`'s constructors (E4M3 codes,
//! `from_float`, `from_safetensors`) and its own properties.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::convert::{bias_repr, float_weight, opt_bias, view_of, weight_slice};
use super::py_layer::py_layer;
use super::PyFp8Linear;
use crate::linear::{PerTensorFP8Linear, QuantMethod};
use crate::python::errors::{invalid, wrong_dtype};
use crate::python::fp8::u8_input;

/// E4M3 codes from uint8 or a zero-copy view of an ml_dtypes float8_e4m3fn array.
fn fp8_codes(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<u8>, Vec<usize>)> {
    let obj = match obj.cast::<PyUntypedArray>() {
        Ok(u) => {
            let name: String = u.dtype().getattr("name")?.extract()?;
            match name.as_str() {
                "float8_e4m3fn" => u.call_method1("view", ("uint8",))?,
                "uint8" => obj.clone(),
                _ => {
                    return Err(wrong_dtype(
                        "weight",
                        "uint8 E4M3 codes or ml_dtypes.float8_e4m3fn (use from_float for float weights)",
                        name,
                    ))
                }
            }
        }
        Err(_) => obj.clone(),
    };
    let a = u8_input(&obj, "weight")?;
    Ok((
        a.as_slice().map_err(|e| invalid("weight", e))?.to_vec(),
        a.shape().to_vec(),
    ))
}

py_layer!(PyFp8Linear, PerTensorFP8Linear, {
    /// A layer from E4M3 codes (uint8, or an `ml_dtypes.float8_e4m3fn` array
    /// read as its codes), the weight's scale, and optional activation
    /// scale and bias.
    #[new]
    #[pyo3(signature = (weight, weight_scale_inv, activation_scale = None, bias = None))]
    fn py_new(
        weight: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_scale_inv)]
        weight_scale_inv: f64,
        #[pyo3(from_py_with = crate::python::scalars::opt_float::activation_scale)]
        activation_scale: Option<f64>,
        bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (weight_scale_inv, activation_scale) =
            (weight_scale_inv as f32, activation_scale.map(|a| a as f32));
        let (codes, shape) = fp8_codes(weight)?;
        let bias = opt_bias(bias, &shape)?;
        let inner =
            PerTensorFP8Linear::new(codes, shape, weight_scale_inv, activation_scale, bias)?;
        Ok(PyFp8Linear {
            inner: Arc::new(inner),
            cuda: None,
        })
    }

    /// Quantize a float weight `[out, in]` (or `[E, out, in]`):
    /// `weight_scale_inv = absmax / 448`, saturating E4M3 encode.
    #[staticmethod]
    #[pyo3(signature = (w, bias = None, activation_scale = None))]
    fn from_float(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::scalars::opt_float::activation_scale)]
        activation_scale: Option<f64>,
    ) -> PyResult<Self> {
        let activation_scale = activation_scale.map(|a| a as f32);
        let (wa, shape) = float_weight(w, "w", &[2, 3])?;
        let w = weight_slice(&wa, "w")?;
        let bias = opt_bias(bias, &shape)?;
        let inner =
            py.detach(|| PerTensorFP8Linear::from_float(w, shape, bias, activation_scale))?;
        Ok(PyFp8Linear {
            inner: Arc::new(inner),
            cuda: None,
        })
    }

    /// Load `<prefix>.weight` (F8_E4M3) with its per-tensor scale in any dialect
    /// (compressed-tensors, AutoFP8, mistral.rs; docs/checkpoints.md), and the
    /// optional activation scale and `<prefix>.bias`.
    #[staticmethod]
    #[pyo3(signature = (path, prefix = String::new()), text_signature = "(path, prefix='')")]
    fn from_safetensors(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
        #[pyo3(from_py_with = crate::python::scalars::text::prefix)] prefix: String,
    ) -> PyResult<Self> {
        let inner = py.detach(|| PerTensorFP8Linear::from_safetensors(&path, &prefix))?;
        Ok(PyFp8Linear {
            inner: Arc::new(inner),
            cuda: None,
        })
    }

    /// The E4M3 codes, shape `weight_shape`: a read-only uint8 view (no copy).
    #[getter]
    fn weight<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let l = &slf.get().inner;
        view_of(slf.as_any(), l.weight(), l.shape())
    }

    /// `W = decode(weight) * weight_scale_inv`.
    #[getter]
    fn weight_scale_inv(&self) -> f32 {
        self.inner.weight_scale_inv()
    }

    /// Static activation scale (the forward quantizes `x` to E4M3 with it), or None.
    #[getter]
    fn activation_scale(&self) -> Option<f32> {
        self.inner.activation_scale()
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "PerTensorFP8Linear(weight=<float8_e4m3fn {:?}>, weight_scale_inv={:?}, activation_scale={}, bias={})",
            l.shape(),
            l.weight_scale_inv(),
            l.activation_scale()
                .map_or("None".into(), |a| format!("{a:?}")),
            bias_repr(l.bias())
        )
    }
});
