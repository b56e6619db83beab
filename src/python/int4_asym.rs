//! `Int4AsymWeight`: an asymmetric INT4 weight (`crate::int4_asym`, the
//! registered format `int4_asym`) quantized from float by min / max or the
//! weighted search, with its parts for NumPy and its forward (the methods
//! every nibble-group weight shares are in `nibble_group.rs`).

use numpy::PyArray3;
use pyo3::prelude::*;

use super::arrays::input;
use super::nibble_group::{
    contiguous, exact_halves, half_pairs_array, nibble_group_methods, out_in, pairs_input,
    rtn_or_search, QuantizeArgs,
};
use crate::format::Int4Asym;
use crate::int4_asym::{AsymMethod, AsymWeight};

/// A `[out, in]` weight in the asymmetric INT4 format: per group of
/// `group_size` inputs, codes 0..15 with a half step `d` and a half
/// minimum `m`, `w = d * q + m` (docs/int4.md "Asymmetric INT4").
#[pyclass(name = "Int4AsymWeight", module = "quantrs._core", frozen)]
pub struct PyInt4AsymWeight {
    inner: AsymWeight,
}

#[pymethods]
impl PyInt4AsymWeight {
    /// Quantize the finite float32 weight `w` `[out, in]` (`in` a multiple of
    /// 32) in groups of `group_size` inputs (a multiple of 32; a shorter last
    /// group where it does not divide `in`) by `method` ("rtn": min / max,
    /// "search": least weighted squared error); `importance` (float32
    /// `[in]`, >= 0: each input's mean x^2) weighs the search's error.
    #[staticmethod]
    #[pyo3(
        signature = (w, *, group_size = 32, method = "search".to_owned(), importance = None),
        text_signature = "(w, *, group_size=32, method='search', importance=None)"
    )]
    fn quantize(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
        #[pyo3(from_py_with = super::nibble_group::method)] method: String,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let m = rtn_or_search(&method, AsymMethod::parse)?;
        let args = QuantizeArgs::read(w, importance)?;
        let inner = args.run(py, |ws, [o, i], imp| {
            AsymWeight::quantize(ws, o, i, group_size, m, imp)
        })?;
        Ok(PyInt4AsymWeight { inner })
    }

    /// The weight from its parts: `codes` uint8 `[out, in]` (each 0..15) and
    /// `scales` float32 `[out, groups, 2]` (`(d, m)` per group, each exactly
    /// a finite half), in groups of `group_size` inputs; the inverse of
    /// `codes()` / `scales()`. Quantizers that pick the codes themselves
    /// (`quantrs.gptq`) write the format through it.
    #[staticmethod]
    #[pyo3(
        signature = (codes, scales, *, group_size = 32),
        text_signature = "(codes, scales, *, group_size=32)"
    )]
    fn from_parts(
        py: Python<'_>,
        codes: &Bound<'_, PyAny>,
        scales: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
    ) -> PyResult<Self> {
        let ca = input::<u8>(codes, "codes")?;
        let [o, i] = out_in(&ca, "codes")?;
        let groups = crate::int4_asym::groups_of(o, i, group_size)?;
        let sa = pairs_input::<f32>(scales, "scales", o, groups)?;
        let halves = exact_halves(contiguous(&sa, "scales")?, groups, "scales")?;
        let cs = contiguous(&ca, "codes")?;
        let inner = py.detach(|| AsymWeight::from_codes(cs, halves, o, i, group_size))?;
        Ok(PyInt4AsymWeight { inner })
    }

    /// Inputs per group.
    #[getter]
    fn group_size(&self) -> usize {
        self.inner.group_size()
    }

    /// Bytes stored: packed codes and half scales.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// `(d, m)` per group as float32 `[out, groups, 2]` (exact halves).
    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        let [o, _] = self.inner.shape();
        half_pairs_array(py, self.inner.scales(), o, self.inner.groups(), "scales")
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!(
            "Int4AsymWeight(shape=({o}, {i}), group_size={})",
            self.inner.group_size()
        )
    }
}

nibble_group_methods!(
    PyInt4AsymWeight,
    Int4Asym,
    "int4_asym",
    codes = "The codes 0..15 as uint8 `[out, in]`.",
    dequantize = "The float32 weight `[out, in]`, `d * q + m` in float32.",
    dequantize_rows = "Rows `start .. stop` of the weight as float32 `[stop - start, in]`,\n\
                       `d * q + m` in float32 (the input gradient's tiles)."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt4AsymWeight>()
}
