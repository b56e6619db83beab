//! `Int4AsymWeight`: an asymmetric INT4 weight (`crate::int4_asym`, the
//! registered format `int4_asym`) quantized from float by min / max or the
//! weighted search, with its parts for NumPy and its forward.

use std::sync::Arc;

use numpy::ndarray::{Array2, Array3};
use numpy::{PyArray2, PyArray3, PyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::invalid;
use crate::error::QuantError;
use crate::format::{Int4Asym, WeightFormat};
use crate::int4_asym::{AsymMethod, AsymWeight};
use crate::linear::{QuantLinear, QuantMethod};

/// The `method` argument.
fn method(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    super::scalars::str_arg(obj, "method")
}

/// A `[out, in]` weight in the asymmetric INT4 format: per group of
/// `group_size` inputs, codes 0..15 with a half step `d` and a half
/// minimum `m`, `w = d * q + m` (docs/int4.md "Asymmetric INT4").
#[pyclass(name = "Int4AsymWeight", module = "quantrs._core", frozen)]
pub struct PyInt4AsymWeight {
    inner: AsymWeight,
}

/// The elements of a C-contiguous array (an error naming `arg` otherwise).
pub(crate) fn contiguous<'a, T: numpy::Element>(
    a: &'a numpy::PyReadonlyArrayDyn<'_, T>,
    arg: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|e| invalid(arg, e))
}

/// A layer's optional float32 `bias` `[out]` (`to_layer` of the weight classes).
pub(crate) fn layer_bias(
    bias: Option<&Bound<'_, PyAny>>,
    out: usize,
) -> PyResult<Option<Vec<f32>>> {
    let Some(b) = bias else { return Ok(None) };
    let ba = input::<f32>(b, "bias")?;
    if ba.shape() != [out] {
        let got = format!("shape {:?}", ba.shape());
        return Err(QuantError::dims("bias", format!("[{out}]"), got).into());
    }
    Ok(Some(contiguous(&ba, "bias")?.to_vec()))
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
        #[pyo3(from_py_with = self::method)] method: String,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let m = AsymMethod::parse(&method).ok_or_else(|| {
            invalid(
                "method",
                format!("expected 'rtn' or 'search', got {method:?}"),
            )
        })?;
        let wa = input::<f32>(w, "w")?;
        let [o, i] = wa.shape()[..] else {
            return Err(QuantError::dims(
                "w",
                "a 2-D array [out, in]",
                format!("shape {:?}", wa.shape()),
            )
            .into());
        };
        let ws = contiguous(&wa, "w")?;
        let imp = importance
            .map(|a| input::<f32>(a, "importance"))
            .transpose()?;
        let imp = match &imp {
            Some(a) if a.ndim() != 1 => {
                return Err(QuantError::dims(
                    "importance",
                    "a 1-D array [in]",
                    format!("shape {:?}", a.shape()),
                )
                .into())
            }
            Some(a) => Some(contiguous(a, "importance")?),
            None => None,
        };
        let inner = py.detach(|| AsymWeight::quantize(ws, o, i, group_size, m, imp))?;
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
        let [o, i] = ca.shape()[..] else {
            let got = format!("shape {:?}", ca.shape());
            return Err(QuantError::dims("codes", "a 2-D array [out, in]", got).into());
        };
        let groups = crate::int4_asym::groups_of(o, i, group_size)?;
        let sa = input::<f32>(scales, "scales")?;
        if sa.shape() != [o, groups, 2] {
            let got = format!("shape {:?}", sa.shape());
            return Err(QuantError::dims("scales", format!("[{o}, {groups}, 2]"), got).into());
        }
        let halves = contiguous(&sa, "scales")?
            .iter()
            .enumerate()
            .map(|(k, &v)| {
                let h = crate::ggml::f32_to_f16(v);
                if crate::linear::fp8_dialect::f16_to_f32(h).to_bits() == v.to_bits() {
                    Ok(h)
                } else {
                    Err(invalid(
                        "scales",
                        format!(
                            "[{}, {}, {}] is {v}, expected a half value",
                            k / (2 * groups),
                            (k / 2) % groups,
                            k % 2
                        ),
                    ))
                }
            })
            .collect::<PyResult<Vec<u16>>>()?;
        let cs = ca.as_slice().map_err(|e| invalid("codes", e))?;
        let inner = py.detach(|| AsymWeight::from_codes(cs, halves, o, i, group_size))?;
        Ok(PyInt4AsymWeight { inner })
    }

    /// The format's registered name, `"int4_asym"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        Int4Asym::INFO.name
    }

    /// `(out, in)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        let [o, i] = self.inner.shape();
        (o, i)
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

    /// The codes 0..15 as uint8 `[out, in]`.
    fn codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let [o, i] = self.inner.shape();
        let q: Vec<u8> = (0..o).flat_map(|r| self.inner.unpacked_row(r)).collect();
        let arr = Array2::from_shape_vec((o, i), q).map_err(|e| invalid("codes", e))?;
        Ok(PyArray2::from_owned_array(py, arr))
    }

    /// `(d, m)` per group as float32 `[out, groups, 2]` (exact halves).
    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray3<f32>>> {
        let [o, _] = self.inner.shape();
        half_pairs_array(py, self.inner.scales(), o, self.inner.groups(), "scales")
    }

    /// The float32 weight `[out, in]`, `d * q + m` in float32.
    fn dequantize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let [_, i] = self.inner.shape();
        let w = py.detach(|| self.inner.dequantize());
        rows_array(py, w, i)
    }

    /// Rows `start .. stop` of the weight as float32 `[stop - start, in]`,
    /// `d * q + m` in float32 (the input gradient's tiles).
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
            Int4Asym::matmul(&self.inner, xs, rows, None, y)
        })
    }

    /// The weight as a `QuantLinear` layer of format `int4_asym`, with
    /// float32 `bias` `[out]`: `forward`, `serialize`, `dequantize_w`.
    #[pyo3(signature = (bias = None))]
    fn to_layer(&self, py: Python<'_>, bias: Option<&Bound<'_, PyAny>>) -> PyResult<Py<PyAny>> {
        let bias = layer_bias(bias, self.inner.shape()[0])?;
        let layer = QuantLinear::<Int4Asym>::from_weight(self.inner.clone(), bias)?;
        let layer: Arc<dyn QuantMethod> = Arc::new(layer);
        super::linear::wrap(py, layer)
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!(
            "Int4AsymWeight(shape=({o}, {i}), group_size={})",
            self.inner.group_size()
        )
    }
}

/// `w` (`rows * in_feat` floats) as a float32 array `[rows, in_feat]`.
pub(crate) fn rows_array<'py>(
    py: Python<'py>,
    w: Vec<f32>,
    in_feat: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let arr = Array2::from_shape_vec((w.len() / in_feat, in_feat), w)
        .map_err(|e| invalid("weight", e))?;
    Ok(PyArray2::from_owned_array(py, arr))
}

/// IEEE halves stored in pairs, `[rows, per_row, 2]`, as an exact float32
/// array (the `(d, m)` of `int4_asym`'s groups, the `(D, Dmin)` of
/// `int4_k`'s super-blocks); `name` names the field in an error.
pub(crate) fn half_pairs_array<'py>(
    py: Python<'py>,
    halves: &[u16],
    rows: usize,
    per_row: usize,
    name: &str,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let v = halves
        .iter()
        .map(|&h| crate::linear::fp8_dialect::f16_to_f32(h))
        .collect();
    let arr = Array3::from_shape_vec((rows, per_row, 2), v).map_err(|e| invalid(name, e))?;
    Ok(PyArray3::from_owned_array(py, arr))
}

/// `y [..., out] = f(x [..., in])` for a float32 array `x`: the shape
/// checks and the GIL release of every packed weight's `matmul`.
pub(crate) fn last_axis_matmul<'py>(
    x: &Bound<'py, PyAny>,
    out_feat: usize,
    in_feat: usize,
    f: impl FnOnce(&[f32], usize, &mut [f32]) -> crate::error::Result<()> + Send,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let py = x.py();
    let xa = input::<f32>(x, "x")?;
    let shape = xa.shape().to_vec();
    if shape.last() != Some(&in_feat) {
        return Err(
            QuantError::dims("x", format!("[..., {in_feat}]"), format!("{shape:?}")).into(),
        );
    }
    let rows = shape[..shape.len() - 1].iter().product::<usize>();
    let src = contiguous(&xa, "x")?;
    let mut y = vec![0f32; rows * out_feat];
    py.detach(|| f(src, rows, &mut y))?;
    let mut out_shape = shape;
    *out_shape.last_mut().unwrap_or(&mut 0) = out_feat;
    let arr = numpy::ndarray::ArrayD::from_shape_vec(out_shape, y).map_err(|e| invalid("x", e))?;
    Ok(PyArrayDyn::from_owned_array(py, arr))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyInt4AsymWeight>()
}
