//! `IntZpWeight`: a zero-point INT weight (`crate::int_zp`, the registered
//! format `int_zp`: GPTQ's and AWQ's `s * (q - z)`), built from its parts
//! (what the checkpoint loaders do) or quantized from float, with its parts
//! for NumPy and its forward (the methods every nibble-group weight shares
//! are in `nibble_group.rs`).

use numpy::ndarray::Array2;
use numpy::{PyArray1, PyArray2, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::{invalid, wrong_dtype, wrong_type};
use super::nibble_group::{contiguous, nibble_group_methods, rows_array};
use crate::error::QuantError;
use crate::format::IntZp;
use crate::int_zp::{quantize_rtn, ZpParts, ZpWeight};

/// The `bits` argument, 4 or 8 (others are refused by the weight).
fn bits(obj: &Bound<'_, PyAny>) -> PyResult<u32> {
    super::sizes::int_in(obj, "bits", 1, 64).map(|v| v as u32)
}

/// `obj` as a C-contiguous array of exactly dtype `name` (`T`): an array of
/// another dtype is a `TypeError` (a cast would wrap codes silently).
fn exact<'py, T: numpy::Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
    name: &str,
) -> PyResult<numpy::PyReadonlyArrayDyn<'py, T>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>() {
        let dt = a.dtype().to_string();
        if dt != name {
            return Err(wrong_dtype(arg, name, dt));
        }
    }
    input::<T>(obj, arg)
}

/// The 2-D shape of `a`, or an error naming `arg` and `expected`.
fn shape2(shape: &[usize], arg: &str, expected: String) -> PyResult<[usize; 2]> {
    match shape {
        [a, b] if format!("[{a}, {b}]") == expected || expected.is_empty() => Ok([*a, *b]),
        _ => {
            let want = if expected.is_empty() {
                "a 2-D array".to_owned()
            } else {
                expected
            };
            Err(QuantError::dims(arg, want, format!("shape {shape:?}")).into())
        }
    }
}

/// A `[out, in]` weight in the zero-point format: per group of
/// `group_size` inputs, 4- or 8-bit codes `q`, a float16 scale `s` and an
/// integer zero point `z`, `w = s * (q - z)` in float32, optionally with an
/// input permutation (GPTQ act-order; docs/checkpoints.md).
#[pyclass(name = "IntZpWeight", module = "quantrs._core", frozen)]
pub struct PyIntZpWeight {
    inner: ZpWeight,
}

#[pymethods]
impl PyIntZpWeight {
    /// From its parts: `codes` uint8 `[out, in]` (each `< 2**bits`, inputs
    /// in stored order), `scales` float16 `[out, groups]` (finite),
    /// `zeros` uint8 `[out, groups]` (`< 2**bits`), `groups =
    /// ceil(in / group_size)`; `perm` (integers `[in]`, a permutation):
    /// stored input `i` is layer input `perm[i]`. `in` and `group_size` are
    /// multiples of 32. Every part is checked; nothing is kept on error.
    #[staticmethod]
    #[pyo3(
        signature = (codes, scales, zeros, *, group_size, bits = 4, perm = None),
        text_signature = "(codes, scales, zeros, *, group_size, bits=4, perm=None)"
    )]
    fn from_parts(
        py: Python<'_>,
        codes: &Bound<'_, PyAny>,
        scales: &Bound<'_, PyAny>,
        zeros: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
        #[pyo3(from_py_with = self::bits)] bits: u32,
        perm: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ca = exact::<u8>(codes, "codes", "uint8")?;
        let [o, i] = shape2(ca.shape(), "codes", String::new())?;
        let groups = i.div_ceil(group_size);
        let want = format!("[{o}, {groups}]");
        let sv = match scales.cast::<PyUntypedArray>() {
            Ok(a) if a.dtype().to_string() == "float16" => a.call_method1("view", ("uint16",))?,
            Ok(a) => return Err(wrong_dtype("scales", "float16", a.dtype())),
            Err(_) => return Err(wrong_type("scales", "a float16 numpy array", scales)),
        };
        let sa = input::<u16>(&sv, "scales")?;
        shape2(sa.shape(), "scales", want.clone())?;
        let za = exact::<u8>(zeros, "zeros", "uint8")?;
        shape2(za.shape(), "zeros", want)?;
        let perm = match perm {
            None => None,
            Some(p) => {
                let pa = input::<i64>(p, "perm")?;
                if pa.shape() != [i] {
                    let got = format!("shape {:?}", pa.shape());
                    return Err(QuantError::dims("perm", format!("[{i}]"), got).into());
                }
                let p = contiguous(&pa, "perm")?;
                if let Some(k) = p.iter().position(|&v| !(0..i as i64).contains(&v)) {
                    let msg = format!("perm[{k}] is {}: expected a permutation of 0..{i}", p[k]);
                    return Err(QuantError::arg(msg).into());
                }
                Some(p.iter().map(|&v| v as u32).collect())
            }
        };
        let (q, s, z) = (
            contiguous(&ca, "codes")?,
            contiguous(&sa, "scales")?,
            contiguous(&za, "zeros")?,
        );
        let parts = ZpParts {
            scales: s.to_vec(),
            zeros: z.to_vec(),
            perm,
            shape: [o, i],
            group_size,
            bits,
        };
        let inner = py.detach(|| ZpWeight::from_codes(q, parts))?;
        Ok(PyIntZpWeight { inner })
    }

    /// Quantize the finite float32 weight `w` `[out, in]` by min / max
    /// (GPTQ's grid without its error feedback) with `bits`-bit codes in
    /// groups of `group_size` inputs.
    #[staticmethod]
    #[pyo3(signature = (w, *, group_size = 128, bits = 4))]
    fn quantize(
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
        #[pyo3(from_py_with = self::bits)] bits: u32,
    ) -> PyResult<Self> {
        let wa = input::<f32>(w, "w")?;
        let [o, i] = shape2(wa.shape(), "w", String::new())?;
        let ws = contiguous(&wa, "w")?;
        // Under `quantrs.threads` (rows split over rayon, which the cap does
        // not reach otherwise).
        let inner =
            py.detach(|| crate::par::run_capped(|| quantize_rtn(ws, o, i, group_size, bits)))?;
        Ok(PyIntZpWeight { inner })
    }

    /// Inputs per group.
    #[getter]
    fn group_size(&self) -> usize {
        self.inner.group_size()
    }

    /// Bits per code, 4 or 8.
    #[getter]
    fn bits(&self) -> u32 {
        self.inner.bits()
    }

    /// Bytes stored: packed codes, half scales, zero points, permutation.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.nbytes()
    }

    /// The input permutation as int64 `[in]` (stored input `i` is layer
    /// input `perm[i]`), or None.
    #[getter]
    fn perm<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<i64>>> {
        let p = self.inner.perm()?;
        Some(PyArray1::from_iter(py, p.iter().map(|&v| i64::from(v))))
    }

    /// The scales as float32 `[out, groups]` (exact halves).
    fn scales<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let v = self
            .inner
            .scales()
            .iter()
            .map(|&h| crate::int_zp::half(h))
            .collect();
        rows_array(py, v, self.inner.groups())
    }

    /// The zero points as uint8 `[out, groups]`.
    fn zeros<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<u8>>> {
        let [o, _] = self.inner.shape();
        let arr = Array2::from_shape_vec((o, self.inner.groups()), self.inner.zeros().to_vec())
            .map_err(|e| invalid("zeros", e))?;
        Ok(PyArray2::from_owned_array(py, arr))
    }

    fn __repr__(&self) -> String {
        let [o, i] = self.inner.shape();
        format!(
            "IntZpWeight(shape=({o}, {i}), group_size={}, bits={}, act_order={})",
            self.inner.group_size(),
            self.inner.bits(),
            if self.inner.perm().is_some() {
                "True"
            } else {
                "False"
            }
        )
    }
}

nibble_group_methods!(
    PyIntZpWeight,
    IntZp,
    "int_zp",
    codes = "The codes as uint8 `[out, in]`, inputs in stored order.",
    dequantize = "The float32 weight `[out, in]` (layer input order), `s * (q - z)`.",
    dequantize_rows = "Rows `start .. stop` of the weight as float32 `[stop - start, in]`."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyIntZpWeight>()
}
