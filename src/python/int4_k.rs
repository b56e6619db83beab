//! `Int4KWeight`: a k-quant-style INT4 weight (`crate::int4_k`, the
//! registered format `int4_k`) quantized from float by group ranges or the
//! weighted search, with its parts for NumPy and its forward (the methods
//! every nibble-group weight shares are in `nibble_group.rs`).

use numpy::ndarray::Array3;
use numpy::PyArray3;
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::invalid;
use super::nibble_group::{
    contiguous, exact_halves, half_pairs_array, nibble_group_methods, out_in, pairs_input,
    rtn_or_search, QuantizeArgs,
};
use crate::format::Int4K;
use crate::int4_k::{KMethod, KWeight};

/// A `[out, in]` weight in the k-quant-style INT4 format: per group of 32
/// inputs, codes 0..15 with 6-bit step and minimum codes under a half pair
/// `(D, Dmin)` per super-block, `w = (D sc) q - Dmin mn` (docs/int4.md
/// "k-quant-style INT4").
#[pyclass(name = "Int4KWeight", module = "quantrs._core", frozen)]
pub struct PyInt4KWeight {
    inner: KWeight,
}

#[pymethods]
impl PyInt4KWeight {
    /// Quantize the finite float32 weight `w` `[out, in]` (`in` a multiple of
    /// 32) by `method` ("rtn": group ranges; "search": least weighted squared
    /// error); `importance` (float32 `[in]`, >= 0: each input's mean x^2)
    /// weighs the search's error.
    #[staticmethod]
    #[pyo3(
        signature = (w, *, method = "search".to_owned(), importance = None),
        text_signature = "(w, *, method='search', importance=None)"
    )]
    fn quantize(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = super::nibble_group::method)] method: String,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let m = rtn_or_search(&method, KMethod::parse)?;
        let args = QuantizeArgs::read(w, importance)?;
        let inner = args.run(py, |ws, [o, i], imp| KWeight::quantize(ws, o, i, m, imp))?;
        Ok(PyInt4KWeight { inner })
    }

    /// The weight from its parts: `codes` uint8 `[out, in]` (each 0..15),
    /// `scale_codes` uint8 `[out, groups, 2]` (`(sc, mn)` per group of 32,
    /// each 0..63) and `supers` float32 `[out, supers, 2]` (`(D, Dmin)` per
    /// super-block, each exactly a finite half); the inverse of `codes()` /
    /// `scale_codes()` / `supers()`.
    #[staticmethod]
    #[pyo3(signature = (codes, scale_codes, supers))]
    fn from_parts(
        py: Python<'_>,
        codes: &Bound<'_, PyAny>,
        scale_codes: &Bound<'_, PyAny>,
        supers: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let ca = input::<u8>(codes, "codes")?;
        let [o, i] = out_in(&ca, "codes")?;
        let groups = crate::int4_k::groups_of(o, i)?;
        let nsb = i / crate::int4_k::super_block(i);
        let sca = pairs_input::<u8>(scale_codes, "scale_codes", o, groups)?;
        let sa = pairs_input::<f32>(supers, "supers", o, nsb)?;
        let halves = exact_halves(contiguous(&sa, "supers")?, nsb, "supers")?;
        let pairs = contiguous(&sca, "scale_codes")?;
        let sc: Vec<u8> = pairs.iter().step_by(2).copied().collect();
        let mn: Vec<u8> = pairs.iter().skip(1).step_by(2).copied().collect();
        let cs = contiguous(&ca, "codes")?;
        let inner = py.detach(|| KWeight::from_codes(cs, &sc, &mn, halves, o, i))?;
        Ok(PyInt4KWeight { inner })
    }

    /// Inputs per group (32).
    #[getter]
    fn group_size(&self) -> usize {
        crate::int4_k::GROUP
    }

    /// Inputs per super-block: 256 where it divides `in`, else `in`.
    #[getter]
    fn super_block(&self) -> usize {
        self.inner.super_block()
    }

    /// Bytes stored: packed codes, packed 6-bit codes and halves.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// `(sc, mn)` per group as uint8 `[out, groups, 2]`.
    fn scale_codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<u8>>> {
        let [o, _] = self.inner.shape();
        let g = self.inner.groups();
        let mut v = Vec::with_capacity(o * g * 2);
        for r in 0..o {
            let (sc, mn) = self.inner.unpacked_scale_codes(r);
            v.extend(sc.iter().zip(&mn).flat_map(|(&s, &m)| [s, m]));
        }
        let arr = Array3::from_shape_vec((o, g, 2), v).map_err(|e| invalid("scale_codes", e))?;
        Ok(PyArray3::from_owned_array(py, arr))
    }

    /// `(D, Dmin)` per super-block as float32 `[out, supers, 2]` (exact halves).
    fn supers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        let [o, _] = self.inner.shape();
        half_pairs_array(
            py,
            self.inner.supers(),
            o,
            self.inner.supers_per_row(),
            "supers",
        )
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!("Int4KWeight(shape=({o}, {i}))")
    }
}

nibble_group_methods!(
    PyInt4KWeight,
    Int4K,
    "int4_k",
    codes = "The codes 0..15 as uint8 `[out, in]`.",
    dequantize = "The float32 weight `[out, in]`, `(D sc) q - Dmin mn` in float32.",
    dequantize_rows = "Rows `start .. stop` of the weight as float32 `[stop - start, in]`."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt4KWeight>()
}
