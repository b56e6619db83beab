//! `Int4KWeight`: a k-quant-style INT4 weight (`crate::int4_k`, the
//! registered format `int4_k`) quantized from float by group ranges or the
//! weighted search, with its parts for NumPy and its forward.

use std::sync::Arc;

use numpy::ndarray::{Array2, Array3};
use numpy::{PyArray2, PyArray3, PyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::invalid;
use super::int4_asym::{contiguous, half_pairs_array, last_axis_matmul, layer_bias, rows_array};
use crate::error::QuantError;
use crate::format::{Int4K, WeightFormat};
use crate::int4_k::{KMethod, KWeight};
use crate::linear::{QuantLinear, QuantMethod};

/// The `method` argument.
fn method(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    super::scalars::str_arg(obj, "method")
}

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
        #[pyo3(from_py_with = self::method)] method: String,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let m = KMethod::parse(&method).ok_or_else(|| {
            invalid(
                "method",
                format!("expected 'rtn' or 'search', got {method:?}"),
            )
        })?;
        let wa = input::<f32>(w, "w")?;
        let [o, i] = wa.shape()[..] else {
            let got = format!("shape {:?}", wa.shape());
            return Err(QuantError::dims("w", "a 2-D array [out, in]", got).into());
        };
        let ws = contiguous(&wa, "w")?;
        let imp = importance
            .map(|a| input::<f32>(a, "importance"))
            .transpose()?;
        let imp = match &imp {
            Some(a) if a.ndim() != 1 => {
                let got = format!("shape {:?}", a.shape());
                return Err(QuantError::dims("importance", "a 1-D array [in]", got).into());
            }
            Some(a) => Some(contiguous(a, "importance")?),
            None => None,
        };
        let inner = py.detach(|| KWeight::quantize(ws, o, i, m, imp))?;
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
        let [o, i] = ca.shape()[..] else {
            let got = format!("shape {:?}", ca.shape());
            return Err(QuantError::dims("codes", "a 2-D array [out, in]", got).into());
        };
        let groups = crate::int4_k::groups_of(o, i)?;
        let nsb = i / crate::int4_k::super_block(i);
        let sca = input::<u8>(scale_codes, "scale_codes")?;
        if sca.shape() != [o, groups, 2] {
            let got = format!("shape {:?}", sca.shape());
            return Err(QuantError::dims("scale_codes", format!("[{o}, {groups}, 2]"), got).into());
        }
        let sa = input::<f32>(supers, "supers")?;
        if sa.shape() != [o, nsb, 2] {
            let got = format!("shape {:?}", sa.shape());
            return Err(QuantError::dims("supers", format!("[{o}, {nsb}, 2]"), got).into());
        }
        let halves = contiguous(&sa, "supers")?
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let h = crate::ggml::f32_to_f16(v);
                if crate::linear::fp8_dialect::f16_to_f32(h).to_bits() == v.to_bits() {
                    Ok(h)
                } else {
                    let at = format!("[{}, {}, {}]", k / (2 * nsb), (k / 2) % nsb, k % 2);
                    Err(invalid(
                        "supers",
                        format!("{at} is {v}, expected a half value"),
                    ))
                }
            })
            .collect::<PyResult<Vec<u16>>>()?;
        let pairs = contiguous(&sca, "scale_codes")?;
        let sc: Vec<u8> = pairs.iter().step_by(2).copied().collect();
        let mn: Vec<u8> = pairs.iter().skip(1).step_by(2).copied().collect();
        let cs = contiguous(&ca, "codes")?;
        let inner = py.detach(|| KWeight::from_codes(cs, &sc, &mn, halves, o, i))?;
        Ok(PyInt4KWeight { inner })
    }

    /// The format's registered name, `"int4_k"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        Int4K::INFO.name
    }

    /// `(out, in)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        let [o, i] = self.inner.shape();
        (o, i)
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

    /// The codes 0..15 as uint8 `[out, in]`.
    fn codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let [o, i] = self.inner.shape();
        let q: Vec<u8> = (0..o).flat_map(|r| self.inner.unpacked_row(r)).collect();
        let arr = Array2::from_shape_vec((o, i), q).map_err(|e| invalid("codes", e))?;
        Ok(PyArray2::from_owned_array(py, arr))
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

    /// The float32 weight `[out, in]`, `(D sc) q - Dmin mn` in float32.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let [_, i] = self.inner.shape();
        let w = py.detach(|| self.inner.dequantize());
        rows_array(py, w, i)
    }

    /// Rows `start .. stop` of the weight as float32 `[stop - start, in]`.
    #[pyo3(signature = (start, stop))]
    fn dequantize_rows<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::python::sizes::start)] start: usize,
        #[pyo3(from_py_with = crate::python::sizes::stop)] stop: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let [_, i] = self.inner.shape();
        let w = py.detach(|| self.inner.dequantize_rows(start..stop))?;
        rows_array(py, w, i)
    }

    /// `x @ W.T` for float32 `x [..., in]` -> `[..., out]`.
    fn matmul<'py>(&self, x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let [o, i] = self.inner.shape();
        last_axis_matmul(x, o, i, |xs, rows, y| {
            Int4K::matmul(&self.inner, xs, rows, None, y)
        })
    }

    /// The weight as a `QuantLinear` layer of format `int4_k`, with float32
    /// `bias` `[out]`: `forward`, `serialize`, `dequantize_w`.
    #[pyo3(signature = (bias = None))]
    fn to_layer(&self, py: Python<'_>, bias: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let bias = layer_bias(bias, self.inner.shape()[0])?;
        let layer = QuantLinear::<Int4K>::from_weight(self.inner.clone(), bias)?;
        let layer: Arc<dyn QuantMethod> = Arc::new(layer);
        super::linear::wrap(py, layer)
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!("Int4KWeight(shape=({o}, {i}))")
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt4KWeight>()
}
