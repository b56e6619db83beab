//! What the packed-weight classes share: the argument checks of their
//! constructors, the arrays they return, the GIL-free `x @ W.T` of their
//! `matmul`, and (`row_weight_methods!`, `nibble_group_methods!`) the
//! methods that read a weight the same way whatever its format, so that
//! each class file keeps only what is its own (how it is built and the
//! parts it exposes).

use numpy::ndarray::{Array2, Array3};
use numpy::{PyArray2, PyArray3, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::invalid;
use crate::error::QuantError;

/// The `method` argument of the quantizers.
pub(crate) fn method(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    super::scalars::str_arg(obj, "method")
}

/// `method` parsed by `parse` (a quantizer's "rtn" / "search").
pub(crate) fn rtn_or_search<M>(method: &str, parse: impl Fn(&str) -> Option<M>) -> PyResult<M> {
    parse(method).ok_or_else(|| {
        invalid(
            "method",
            format!("expected 'rtn' or 'search', got {method:?}"),
        )
    })
}

/// The elements of a C-contiguous array (an error naming `arg` otherwise).
pub(crate) fn contiguous<'a, T: numpy::Element>(
    a: &'a PyReadonlyArrayDyn<'_, T>,
    arg: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|e| invalid(arg, e))
}

/// `[out, in]` of the 2-D array `a` named `arg`.
pub(crate) fn out_in<T: numpy::Element>(
    a: &PyReadonlyArrayDyn<'_, T>,
    arg: &str,
) -> PyResult<[usize; 2]> {
    match a.shape()[..] {
        [o, i] => Ok([o, i]),
        _ => {
            let got = format!("shape {:?}", a.shape());
            Err(QuantError::dims(arg, "a 2-D array [out, in]", got).into())
        }
    }
}

/// `obj` (named `arg`) as an array of `T` shaped `[rows, per_row, 2]`: the
/// pairs per group or super-block of a weight's parts.
pub(crate) fn pairs_input<'py, T: numpy::Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    rows: usize,
    per_row: usize,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let a = input::<T>(obj, arg)?;
    if a.shape() != [rows, per_row, 2] {
        let got = format!("shape {:?}", a.shape());
        return Err(QuantError::dims(arg, format!("[{rows}, {per_row}, 2]"), got).into());
    }
    Ok(a)
}

/// The optional float32 `importance` of a weighted quantizer, checked to be
/// 1-D (`want` names its length in the error: `"[in]"`); its elements are
/// `contiguous(a, "importance")`.
pub(crate) fn importance<'py>(
    obj: Option<&Bound<'py, PyAny>>,
    want: &str,
) -> PyResult<Option<PyReadonlyArrayDyn<'py, f32>>> {
    let Some(obj) = obj else { return Ok(None) };
    let a = input::<f32>(obj, "importance")?;
    if a.ndim() != 1 {
        let got = format!("shape {:?}", a.shape());
        return Err(QuantError::dims("importance", format!("a 1-D array {want}"), got).into());
    }
    Ok(Some(a))
}

/// What [`QuantizeArgs::parts`] lends: `w`'s elements, its `[out, in]` and
/// `importance`'s elements.
pub(crate) type QuantizeParts<'a> = (&'a [f32], [usize; 2], Option<&'a [f32]>);

/// A quantizer's float32 `w` `[out, in]` and optional `importance` `[in]`,
/// checked here for shape (and `importance` for values: finite and `>= 0`);
/// every error names the argument and the first bad element. `w`'s values
/// (finite, |w| <= 65504) are left to the core quantizer's check
/// (`int4_asym::checks`, which names `w[r, c]` alike), which makes it while
/// quantizing, so that a call reads `w` once. Each class's `quantize` keeps
/// only its own arguments.
pub(crate) struct QuantizeArgs<'py> {
    w: PyReadonlyArrayDyn<'py, f32>,
    importance: Option<PyReadonlyArrayDyn<'py, f32>>,
}

impl<'py> QuantizeArgs<'py> {
    /// `w` and `importance` as arrays, checked (errors naming the argument).
    pub(crate) fn read(
        w: &Bound<'py, PyAny>,
        importance: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let w = input::<f32>(w, "w")?;
        let [_, in_feat] = out_in(&w, "w")?;
        contiguous(&w, "w")?;
        let importance = self::importance(importance, &format!("[{in_feat}]"))?;
        if let Some(a) = &importance {
            if a.shape() != [in_feat] {
                let want = format!("[{in_feat}] (one per input of w)");
                let got = format!("shape {:?}", a.shape());
                return Err(QuantError::dims("importance", want, got).into());
            }
            importance_values(contiguous(a, "importance")?)?;
        }
        Ok(Self { w, importance })
    }

    /// `w`'s elements, its `[out, in]` and `importance`'s elements.
    pub(crate) fn parts(&self) -> PyResult<QuantizeParts<'_>> {
        let shape = out_in(&self.w, "w")?;
        let w = contiguous(&self.w, "w")?;
        let imp = self
            .importance
            .as_ref()
            .map(|a| contiguous(a, "importance"))
            .transpose()?;
        Ok((w, shape, imp))
    }

    /// `quantize(w, [out, in], importance)` with the GIL released, on the
    /// threads `quantrs.threads` allows (`crate::par::run_capped`: the
    /// quantizers split rows over rayon, which the cap does not reach
    /// otherwise).
    pub(crate) fn run<T: Send, E: Send>(
        &self,
        py: Python<'_>,
        quantize: impl FnOnce(&[f32], [usize; 2], Option<&[f32]>) -> Result<T, E> + Send,
    ) -> PyResult<T>
    where
        PyErr: From<E>,
    {
        let (w, shape, imp) = self.parts()?;
        Ok(py.detach(|| crate::par::run_capped(|| quantize(w, shape, imp)))?)
    }
}

/// Every element of `importance` finite and `>= 0`, else an error naming
/// the first one that is not.
fn importance_values(imp: &[f32]) -> PyResult<()> {
    match imp.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
        None => Ok(()),
        Some(i) => {
            let msg = format!("importance[{i}] is {}, expected finite and >= 0", imp[i]);
            Err(QuantError::arg(msg).into())
        }
    }
}

/// The float32 values `v` of `[rows, per_row, 2]` pairs (named `arg`) as
/// IEEE halves, each exactly representable (an error naming the first
/// index that is not, so nothing is rounded silently).
pub(crate) fn exact_halves(v: &[f32], per_row: usize, arg: &str) -> PyResult<Vec<u16>> {
    v.iter()
        .enumerate()
        .map(|(k, &v)| {
            let h = crate::ggml::f32_to_f16(v);
            if crate::linear::fp8_dialect::f16_to_f32(h).to_bits() == v.to_bits() {
                Ok(h)
            } else {
                let at = format!("[{}, {}, {}]", k / (2 * per_row), (k / 2) % per_row, k % 2);
                Err(invalid(arg, format!("{at} is {v}, expected a half value")))
            }
        })
        .collect()
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

/// The codes of `rows` rows (`row(r)` unpacked, `in_feat` each) as uint8
/// `[rows, in_feat]`.
pub(crate) fn codes_array<I: IntoIterator<Item = u8>>(
    py: Python<'_>,
    rows: usize,
    in_feat: usize,
    row: impl Fn(usize) -> I,
) -> PyResult<Bound<'_, PyArray2<u8>>> {
    let q: Vec<u8> = (0..rows).flat_map(row).collect();
    let arr = Array2::from_shape_vec((rows, in_feat), q).map_err(|e| invalid("codes", e))?;
    Ok(PyArray2::from_owned_array(py, arr))
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

/// `row_weight_methods!(Class, dequantize = "doc", dequantize_rows = "doc")`:
/// a `#[pymethods]` block (the crate builds PyO3 with `multiple-pymethods`)
/// with `shape`, `dequantize` and `dequantize_rows` over `self.inner`, any
/// weight with `shape() -> [out, in]`, `dequantize() -> Vec<f32>` and
/// `dequantize_rows(range) -> Result<Vec<f32>>`. The docs are the class's
/// own, since each states its format's arithmetic.
macro_rules! row_weight_methods {
    ($class:ident, dequantize = $deq:literal, dequantize_rows = $rows:literal) => {
        #[pymethods]
        impl $class {
            /// `(out, in)`.
            #[getter]
            fn shape(&self) -> (usize, usize) {
                let [o, i] = self.inner.shape();
                (o, i)
            }

            #[doc = $deq]
            fn dequantize<'py>(
                &self,
                py: Python<'py>,
            ) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
                let [_, i] = self.inner.shape();
                let w = py.detach(|| self.inner.dequantize());
                $crate::python::nibble_group::rows_array(py, w, i)
            }

            #[doc = $rows]
            #[pyo3(signature = (start, stop))]
            fn dequantize_rows<'py>(
                &self,
                py: Python<'py>,
                #[pyo3(from_py_with = $crate::python::sizes::start)] start: usize,
                #[pyo3(from_py_with = $crate::python::sizes::stop)] stop: usize,
            ) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
                let [_, i] = self.inner.shape();
                let w = py.detach(|| self.inner.dequantize_rows(start..stop))?;
                $crate::python::nibble_group::rows_array(py, w, i)
            }
        }
    };
}
pub(crate) use row_weight_methods;

/// `nibble_group_methods!(Class, Format, "name", codes = "doc", dequantize =
/// "doc", dequantize_rows = "doc")`: `row_weight_methods!` plus the methods
/// of a weight of a registered `WeightFormat` whose codes unpack row by row
/// (`self.inner.unpacked_row(r)`): `type`, `codes`, `matmul` and
/// `to_layer`. `"name"` is the format's registered name, for the docs.
macro_rules! nibble_group_methods {
    (
        $class:ident, $format:ty, $name:literal,
        codes = $codes:literal, dequantize = $deq:literal, dequantize_rows = $rows:literal
    ) => {
        $crate::python::nibble_group::row_weight_methods!(
            $class,
            dequantize = $deq,
            dequantize_rows = $rows
        );

        #[pymethods]
        impl $class {
            #[doc = concat!("The format's registered name, `\"", $name, "\"`.")]
            #[getter]
            fn r#type(&self) -> &'static str {
                <$format as $crate::format::WeightFormat>::INFO.name
            }

            #[doc = $codes]
            fn codes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArray2<u8>>> {
                let [o, i] = self.inner.shape();
                $crate::python::nibble_group::codes_array(py, o, i, |r| self.inner.unpacked_row(r))
            }

            /// `x @ W.T` for float32 `x [..., in]` -> `[..., out]`.
            fn matmul<'py>(
                &self,
                x: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
                let [o, i] = self.inner.shape();
                $crate::python::nibble_group::last_axis_matmul(x, o, i, |xs, rows, y| {
                    <$format as $crate::format::WeightFormat>::matmul(
                        &self.inner,
                        xs,
                        rows,
                        None,
                        y,
                    )
                })
            }

            #[doc = concat!(
                        "The weight as a `QuantLinear` layer of format `", $name, "`, with\n",
                        "float32 `bias` `[out]`: `forward`, `serialize`, `dequantize_w`."
                    )]
            #[pyo3(signature = (bias = None))]
            fn to_layer(
                &self,
                py: Python<'_>,
                bias: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<Py<PyAny>> {
                let bias = $crate::python::nibble_group::layer_bias(bias, self.inner.shape()[0])?;
                let layer =
                    $crate::linear::QuantLinear::<$format>::from_weight(self.inner.clone(), bias)?;
                let layer: std::sync::Arc<dyn $crate::linear::QuantMethod> =
                    std::sync::Arc::new(layer);
                $crate::python::linear::wrap(py, layer)
            }
        }
    };
}
pub(crate) use nibble_group_methods;
