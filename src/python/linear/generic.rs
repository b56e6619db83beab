//! `QuantLinear`: the layer class of any registered format (its
//! constructor from a float weight and a format name, and its own
//! properties); every `QuantLinear<F>` without a class of its own is
//! returned as one.

use pyo3::prelude::*;

use super::convert::{bias_repr, float_weight, format_names, opt_bias, weight_slice};
use super::py_layer::py_layer;
use super::PyQuantLinear;
use crate::format::FormatId;
use crate::linear::{quantize_layer, QuantMethod};
use crate::python::errors::invalid;

py_layer!(PyQuantLinear, dyn QuantMethod, {
    /// Quantize the float weight `[out, in]` to `format` (any registered
    /// name or alias: "float32", "int8", "int4", "fp8_e4m3", ...);
    /// `group_size` applies to formats with groups.
    #[new]
    #[pyo3(signature = (weight, format, bias = None, *, group_size = 32))]
    fn py_new(
        py: Python<'_>,
        weight: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::text::format)] format: String,
        bias: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
    ) -> PyResult<Self> {
        let id = FormatId::parse(&format).ok_or_else(|| {
            invalid(
                "format",
                format!("expected one of {}, got {format:?}", format_names(false)),
            )
        })?;
        let (wa, s) = float_weight(weight, "weight", &[2])?;
        let w = weight_slice(&wa, "weight")?;
        let bias = opt_bias(bias, &s)?;
        let inner = py.detach(|| quantize_layer(id, w, s[0], s[1], group_size, bias))?;
        Ok(PyQuantLinear { inner, cuda: None })
    }

    /// The registered name of the weight's format, e.g. `"int8"`.
    #[getter]
    fn format(&self) -> &'static str {
        let (d, _) = self.inner.dtype_and_device();
        d.format().info().name
    }

    fn __repr__(&self) -> String {
        format!(
            "QuantLinear(format='{}', weight_shape={:?}, bias={})",
            self.format(),
            self.inner.weight_shape(),
            bias_repr(self.inner.bias())
        )
    }
});
