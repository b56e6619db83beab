//! Bindings of the FP8 codecs (`quantrs.fp8` wraps them in Python).

use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::input;
use super::errors::invalid;
use crate::fp8::{decode_slice, encode_slice, Fp8Format};

/// Parse a format name, naming the argument on failure.
pub(crate) fn parse_fmt(fmt: &str) -> PyResult<Fp8Format> {
    Fp8Format::parse(fmt).ok_or_else(|| {
        invalid(
            "fmt",
            format!("expected 'e4m3' (float8_e4m3fn) or 'e5m2', got {fmt:?}"),
        )
    })
}

/// FP8 codes as a read-only uint8 array. A NumPy array must already be
/// uint8 (casting other integers could wrap silently): `TypeError`
/// otherwise. Non-arrays (lists) go through `numpy.ascontiguousarray`.
pub(crate) fn u8_input<'py>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<numpy::PyReadonlyArrayDyn<'py, u8>> {
    if let Ok(u) = obj.cast::<numpy::PyUntypedArray>() {
        if obj.cast::<PyArrayDyn<u8>>().is_err() {
            return Err(super::errors::wrong_dtype(arg, "uint8", u.dtype()));
        }
    }
    input::<u8>(obj, arg)
}

/// Encode float32 values (any array-like; other float dtypes are converted to
/// float32 first) into FP8 codes of the same shape (uint8).
#[pyfunction]
#[pyo3(
    signature = (x, fmt = "e4m3".to_owned(), saturate = false),
    text_signature = "(x, fmt='e4m3', saturate=False)"
)]
fn fp8_encode<'py>(
    x: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::python::scalars::text::fmt)] fmt: String,
    #[pyo3(from_py_with = crate::python::scalars::flag::saturate)] saturate: bool,
) -> PyResult<Bound<'py, PyArrayDyn<u8>>> {
    let py = x.py();
    let fmt = parse_fmt(&fmt)?;
    let x = input::<f32>(x, "x")?;
    // SAFETY: the array is created uninitialised and fully written below
    // before Python can see it.
    let out = unsafe { PyArrayDyn::<u8>::new(py, x.shape(), false) };
    {
        let mut o = out.readwrite();
        let dst = o.as_slice_mut().map_err(|e| invalid("out", e))?;
        let src = x.as_slice().map_err(|e| invalid("x", e))?;
        py.detach(|| encode_slice(src, dst, fmt, saturate));
    }
    Ok(out)
}

/// Decode FP8 codes (uint8, any shape) to float32.
#[pyfunction]
#[pyo3(signature = (codes, fmt = "e4m3".to_owned()), text_signature = "(codes, fmt='e4m3')")]
fn fp8_decode<'py>(
    codes: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = crate::python::scalars::text::fmt)] fmt: String,
) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let py = codes.py();
    let fmt = parse_fmt(&fmt)?;
    let codes = u8_input(codes, "codes")?;
    // SAFETY: fully written below before Python can see it.
    let out = unsafe { PyArrayDyn::<f32>::new(py, codes.shape(), false) };
    {
        let mut o = out.readwrite();
        let dst = o.as_slice_mut().map_err(|e| invalid("out", e))?;
        let src = codes.as_slice().map_err(|e| invalid("codes", e))?;
        py.detach(|| decode_slice(src, dst, fmt));
    }
    Ok(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fp8_encode, m)?)?;
    m.add_function(wrap_pyfunction!(fp8_decode, m)?)?;
    Ok(())
}
