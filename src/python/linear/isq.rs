//! The in-situ-quantization layer family: `UnquantLinear` (float32),
//! `Int8Linear` (per-row int8) and `Int4Linear` (over a `QuantizedWeight`):
//! each class's constructors and own properties.

use std::sync::Arc;

use numpy::{PyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::convert::{bias_repr, float_weight, opt_bias, opt_f32_shaped, view_of, weight_slice};
use super::py_layer::py_layer;
use super::{PyInt4Linear, PyInt8Linear, PyUnquantLinear};
use crate::error::QuantError;
use crate::linear::{Int4Linear, Int8Linear, QuantMethod, UnquantLinear};
use crate::python::arrays::input;
use crate::python::errors::{invalid, wrong_dtype};
use crate::python::int4::PyQuantizedWeight;

py_layer!(PyUnquantLinear, UnquantLinear, {
    /// A layer over a copy of the float32 weight `[out, in]` and optional bias.
    #[new]
    #[pyo3(signature = (weight, bias = None))]
    fn py_new(weight: &Bound<'_, PyAny>, bias: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let (wa, s) = float_weight(weight, "weight", &[2])?;
        let w = weight_slice(&wa, "weight")?.to_vec(); // the layer owns its f32 weight
        let bias = opt_bias(bias, &s)?;
        Ok(PyUnquantLinear {
            inner: Arc::new(UnquantLinear::new(w, s[0], s[1], bias)?),
            cuda: None,
        })
    }

    /// The float32 weight `[out, in]`: a read-only view (no copy).
    #[getter]
    fn weight<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let l = &slf.get().inner;
        view_of(slf.as_any(), l.weight(), &l.weight_shape())
    }

    fn __repr__(&self) -> String {
        format!(
            "UnquantLinear(weight=<float32 {:?}>, bias={})",
            self.inner.weight_shape(),
            bias_repr(self.inner.bias())
        )
    }
});

py_layer!(PyInt8Linear, Int8Linear, {
    /// A layer from int8 codes `q [out, in]`, per-row `scales [out]`
    /// (`W = q * scales[:, None]`) and optional bias.
    #[new]
    #[pyo3(signature = (q, scales, bias = None))]
    fn py_new(
        q: &Bound<'_, PyAny>,
        scales: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if let Ok(u) = q.cast::<PyUntypedArray>() {
            if q.cast::<PyArrayDyn<i8>>().is_err() {
                return Err(wrong_dtype("q", "int8", u.dtype()));
            }
        }
        let qa = input::<i8>(q, "q")?;
        if qa.ndim() != 2 {
            return Err(QuantError::dims("q", "[out, in]", format!("{:?}", qa.shape())).into());
        }
        let (out, inf) = (qa.shape()[0], qa.shape()[1]);
        let qv = qa.as_slice().map_err(|e| invalid("q", e))?.to_vec();
        // (out,), or (out, 1) as compressed-tensors stores per-channel scales.
        let sv = opt_f32_shaped(Some(scales), "scales", &[&[out], &[out, 1]])?.unwrap_or_default();
        let bias = opt_bias(bias, qa.shape())?;
        Ok(PyInt8Linear {
            inner: Arc::new(Int8Linear::new(qv, sv, out, inf, bias)?),
            cuda: None,
        })
    }

    /// Quantize a float weight `[out, in]` per output row.
    #[staticmethod]
    #[pyo3(signature = (w, bias = None))]
    fn from_float(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (wa, s) = float_weight(w, "w", &[2])?;
        let w = weight_slice(&wa, "w")?;
        let bias = opt_bias(bias, &s)?;
        let inner = py.detach(|| Int8Linear::from_float(w, s[0], s[1], bias))?;
        Ok(PyInt8Linear {
            inner: Arc::new(inner),
            cuda: None,
        })
    }

    /// The int8 codes `[out, in]`: a read-only view (no copy).
    #[getter]
    fn q<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let l = &slf.get().inner;
        view_of(slf.as_any(), l.q(), &l.weight_shape())
    }

    /// The per-row scales `[out]`: a read-only view (no copy).
    #[getter]
    fn scales<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let l = &slf.get().inner;
        view_of(slf.as_any(), l.scales(), &[l.out_features()])
    }

    fn __repr__(&self) -> String {
        format!(
            "Int8Linear(q=<int8 {:?}>, scales=<float32 [{}]>, bias={})",
            self.inner.weight_shape(),
            self.inner.out_features(),
            bias_repr(self.inner.bias())
        )
    }
});

py_layer!(PyInt4Linear, Int4Linear, {
    /// A layer over a packed `QuantizedWeight` `[in, out]` and optional bias `[out]`.
    #[new]
    #[pyo3(signature = (qweight, bias = None))]
    fn py_new(
        qweight: PyRef<'_, PyQuantizedWeight>,
        bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let bias = opt_bias(bias, &[qweight.inner.out_feat(), qweight.inner.in_feat()])?;
        Ok(PyInt4Linear {
            inner: Arc::new(Int4Linear::new(qweight.inner.clone(), bias)?),
            cuda: None,
        })
    }

    /// Quantize a float weight `[out, in]`; with `imatrix_weight` `[in]` the
    /// group scales minimize the importance-weighted squared error.
    #[staticmethod]
    #[pyo3(signature = (w, bias = None, group_size = 32, imatrix_weight = None))]
    fn from_float(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        bias: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
        imatrix_weight: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let (wa, s) = float_weight(w, "w", &[2])?;
        let w = weight_slice(&wa, "w")?;
        let bias = opt_bias(bias, &s)?;
        let im = opt_f32_shaped(imatrix_weight, "imatrix_weight", &[&[s[1]]])?;
        if let Some(a) = &im {
            if let Some(i) = a.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(invalid(
                    "imatrix_weight",
                    format!("[{i}] = {} is not finite and >= 0", a[i]),
                ));
            }
        }
        let inner =
            py.detach(|| Int4Linear::from_float(w, s[0], s[1], group_size, bias, im.as_deref()))?;
        Ok(PyInt4Linear {
            inner: Arc::new(inner),
            cuda: None,
        })
    }

    /// The packed weight (a copy).
    #[getter]
    fn qweight(&self) -> PyQuantizedWeight {
        PyQuantizedWeight::host(self.inner.qweight().clone())
    }

    fn __repr__(&self) -> String {
        let q = self.inner.qweight();
        format!(
            "Int4Linear(qweight=QuantizedWeight(in_feat={}, out_feat={}, group_size={}), bias={})",
            q.in_feat(),
            q.out_feat(),
            q.group_size(),
            bias_repr(self.inner.bias())
        )
    }
});
