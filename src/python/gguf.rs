//! `GgufWeight`: one GGUF block-quantized weight of any `crate::ggml`
//! type, its packed blocks kept as the file stores them.

use numpy::{PyArrayDyn, PyArrayMethods};
use pyo3::prelude::*;

use super::borrowed::{opt_slice, read_opt, shared, shared_bias};
use super::errors::invalid;
use super::fp8::u8_input;
use super::nibble_group::{last_axis_matmul, row_weight_methods, QuantizeArgs};
use crate::error::QuantError;
use crate::format::{matmul_blocks, GgufBlocks, GgufWeight as Packed, WeightFormat};
use crate::ggml::quantize::quantize_matrix;
use crate::ggml::{GgmlType, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use crate::int4::Activations;

/// `matmul_blocks` of one block type.
type BorrowedForward =
    fn(&[u8], [usize; 2], &[f32], usize, Option<&[f32]>, &mut [f32]) -> crate::error::Result<()>;

/// Declares the weight of every type and the dispatch over them.
macro_rules! types {
    ($($v:ident => $t:ty),*) => {
        #[derive(Clone, Debug)]
        enum AnyWeight {
            $($v(Packed<$t>),)*
        }

        /// The type names `from_bytes` accepts.
        const NAMES: &[&str] = &[$(<$t as GgmlType>::NAME,)*];

        impl AnyWeight {
            fn new(name: &str, data: Vec<u8>, out: usize, inf: usize) -> PyResult<Self> {
                $(if name == <$t as GgmlType>::NAME {
                    return Ok(AnyWeight::$v(Packed::new(data, out, inf)?));
                })*
                Err(invalid("type", format!("expected one of {NAMES:?}, got {name:?}")))
            }

            /// `w` (`[out, in]` float32) quantized to the type named
            /// `name` (`crate::ggml::quantize`).
            fn quantize(
                name: &str,
                w: &[f32],
                out: usize,
                inf: usize,
                importance: Option<&[f32]>,
            ) -> PyResult<Self> {
                $(if name == <$t as GgmlType>::NAME {
                    let data = quantize_matrix::<$t>(w, out, inf, importance)?;
                    return Ok(AnyWeight::$v(Packed::new(data, out, inf)?));
                })*
                Err(invalid("type", format!("expected one of {NAMES:?}, got {name:?}")))
            }

            fn name(&self) -> &'static str {
                match self { $(AnyWeight::$v(_) => <$t as GgmlType>::NAME,)* }
            }

            fn bytes(&self) -> &[u8] {
                match self { $(AnyWeight::$v(w) => w.bytes(),)* }
            }

            fn shape(&self) -> [usize; 2] {
                match self { $(AnyWeight::$v(w) => GgufBlocks::<$t>::shape(w),)* }
            }

            fn dequantize(&self) -> Vec<f32> {
                match self { $(AnyWeight::$v(w) => GgufBlocks::<$t>::dequantize(w),)* }
            }

            fn dequantize_rows(&self, rows: std::ops::Range<usize>) -> crate::error::Result<Vec<f32>> {
                match self { $(AnyWeight::$v(w) => w.dequantize_rows(rows),)* }
            }

            fn matmul(
                &self,
                x: &[f32],
                rows: usize,
                y: &mut [f32],
                act: Activations,
            ) -> crate::error::Result<()> {
                match (self, act) {
                    $((AnyWeight::$v(w), Activations::Float32) =>
                        GgufBlocks::<$t>::matmul(w, x, rows, None, y),
                    (AnyWeight::$v(w), Activations::Int8) =>
                        GgufBlocks::<$t>::matmul_int8_activations(w, x, rows, y),)*
                }
            }
        }

        /// The forward over borrowed blocks of the type named `name`
        /// (`matmul_blocks`) with its block's elements and bytes, or None
        /// for a name outside `NAMES`.
        fn borrowed_forward(name: &str) -> Option<(BorrowedForward, usize, usize)> {
            $(if name == <$t as GgmlType>::NAME {
                return Some((matmul_blocks::<$t>, <$t as GgmlType>::ELEMS, <$t as GgmlType>::BYTES));
            })*
            None
        }
    };
}

types!(Q8_0 => Q8_0, Q4_0 => Q4_0, Q4_1 => Q4_1, Q5_0 => Q5_0, Q5_1 => Q5_1,
       Q4K => Q4K, Q5K => Q5K, Q6K => Q6K);

/// A `[out, in]` weight as GGUF blocks of one ggml type (`q8_0`, `q4_0`,
/// `q4_1`, `q5_0`, `q5_1`, `q4_k`, `q5_k`, `q6_k`), packed as in the file.
#[pyclass(name = "GgufWeight", module = "quantrs._core", frozen)]
pub struct PyGgufWeight {
    inner: AnyWeight,
}

#[pymethods]
impl PyGgufWeight {
    /// The weight of `type` and `shape` `(out, in)` from its packed blocks
    /// (`buffer`, uint8, any shape, copied once); checks the length and
    /// that every half scale is finite.
    #[staticmethod]
    #[pyo3(signature = (r#type, shape, buffer), text_signature = "(type, shape, buffer)")]
    fn from_bytes(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::scalars::text::type_name)] r#type: String,
        shape: (usize, usize),
        buffer: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let name = r#type.to_ascii_lowercase();
        let codes = u8_input(buffer, "buffer")?;
        let data = codes.as_slice().map_err(|e| invalid("buffer", e))?.to_vec();
        let (out, inf) = shape;
        let inner = py.detach(|| AnyWeight::new(&name, data, out, inf))?;
        Ok(PyGgufWeight { inner })
    }

    /// Quantize the finite float32 weight `w` `[out, in]` to `type`'s
    /// blocks (`in` a multiple of its block: 32, or 256 for the k-quants)
    /// with ggml's quantizer: llama.cpp's bytes, and for the legacy types
    /// also `gguf.quants.quantize`'s. `importance` (float32 `[in]`, >= 0:
    /// each input's mean x^2, llama.cpp's imatrix) selects ggml's weighted
    /// search; Q8_0 ignores it, as ggml does (docs/formats.md).
    #[staticmethod]
    #[pyo3(
        signature = (w, r#type, *, importance = None),
        text_signature = "(w, type, *, importance=None)"
    )]
    fn quantize(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::text::type_name)] r#type: String,
        importance: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let name = r#type.to_ascii_lowercase();
        if !NAMES.contains(&name.as_str()) {
            return Err(invalid(
                "type",
                format!("expected one of {NAMES:?}, got {name:?}"),
            ));
        }
        let args = QuantizeArgs::read(w, importance)?;
        let inner = args.run(py, |ws, [o, i], imp| {
            AnyWeight::quantize(&name, ws, o, i, imp)
        })?;
        Ok(PyGgufWeight { inner })
    }

    /// The ggml type name (`q4_0`, ...).
    #[getter]
    fn r#type(&self) -> &'static str {
        self.inner.name()
    }

    /// Bytes of packed blocks.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.bytes().len()
    }

    /// The packed blocks as a uint8 array (a copy).
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, numpy::PyArray1<u8>> {
        numpy::PyArray1::from_slice(py, self.inner.bytes())
    }

    /// `x @ W.T` for float32 `x [..., in]` -> `[..., out]`.
    /// `activations="int8"` quantizes `x` per block to int8 (ggml's Q8_0 /
    /// Q8_K) and runs integer block dots (docs/formats.md).
    #[pyo3(signature = (x, *, activations = "float32"))]
    fn matmul<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        activations: &str,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let act = Activations::parse(activations)?;
        let [o, i] = self.inner.shape();
        last_axis_matmul(x, o, i, |xs, rows, y| self.inner.matmul(xs, rows, y, act))
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!("GgufWeight(type='{}', shape=({o}, {i}))", self.inner.name())
    }
}

row_weight_methods!(
    PyGgufWeight,
    dequantize = "The float32 weight `[out, in]`, exactly as ggml decodes it.",
    dequantize_rows = "Rows `start .. stop` of the weight as float32 `[stop - start, in]`,\n\
                       exactly as ggml decodes them (the input gradient's tiles)."
);

/// `x @ W.T + bias` for float32 `x [..., in_feat]` over `W` `[out, in_feat]`
/// given as GGUF blocks of `type` read in place from the caller's array
/// (`data`: uint8, C-contiguous, `out` rows of blocks exactly; `bias`
/// float32 `[out]` or None): `quantrs.torch.GgufLinear`'s forward over its
/// `qweight` buffer, so the module holds its packed bytes once and an
/// in-place write is seen by the next call. `out` is `data`'s length over
/// the bytes of one row.
#[pyfunction]
#[pyo3(signature = (x, data, r#type, in_feat, bias), text_signature = "(x, data, type, in_feat, bias)")]
pub fn gguf_linear<'py>(
    x: &Bound<'py, PyAny>,
    data: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::python::scalars::text::type_name)] r#type: String,
    #[pyo3(from_py_with = crate::python::sizes::in_feat)] in_feat: usize,
    bias: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let name = r#type.to_ascii_lowercase();
    let (forward, elems, block_bytes) = borrowed_forward(&name)
        .ok_or_else(|| invalid("type", format!("expected one of {NAMES:?}, got {name:?}")))?;
    if in_feat == 0 || !in_feat.is_multiple_of(elems) {
        let want = format!("a positive multiple of {elems} ({name} blocks)");
        return Err(QuantError::dims("in_feat", want, in_feat).into());
    }
    let d = shared::<u8>(data, "data", None)?;
    let dv = d.try_readonly()?;
    let bytes = dv.as_slice().map_err(|e| invalid("data", e))?;
    let row = in_feat / elems * block_bytes;
    if bytes.is_empty() || !bytes.len().is_multiple_of(row) {
        let want = format!("whole rows of {row} bytes ({in_feat} inputs of {name})");
        return Err(QuantError::dims("data", want, format!("{} bytes", bytes.len())).into());
    }
    let out = bytes.len() / row;
    let b = shared_bias(bias, out)?;
    let bv = read_opt(&b)?;
    let bias = opt_slice(&bv, "bias")?;
    last_axis_matmul(x, out, in_feat, |xs, rows, y| {
        forward(bytes, [out, in_feat], xs, rows, bias, y)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGgufWeight>()?;
    m.add_function(pyo3::wrap_pyfunction!(gguf_linear, m)?)
}
