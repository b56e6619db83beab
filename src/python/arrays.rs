//! Array conversion and validation shared by every binding file.
//!
//! - Read-only inputs accept any array-like and are converted only when they
//!   are not already the required dtype and C-contiguous, so the fast path
//!   copies nothing.
//! - In-place targets (`param`, `master`, `out=`) must be exactly the right
//!   dtype (`TypeError` otherwise), C-contiguous and writable (`ValueError`
//!   otherwise); a temporary copy is never updated silently.

use numpy::{
    Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn,
    PyReadwriteArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

use super::errors::{invalid, type_name, wrong_dtype, wrong_type};
use crate::error::QuantError;

/// `numpy` module, imported once.
pub fn numpy_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NP: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    Ok(NP
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

fn dtype_name(obj: &Bound<'_, PyAny>) -> String {
    obj.getattr("dtype")
        .and_then(|d| d.str())
        .map(|s| s.to_string())
        .unwrap_or_else(|_| type_name(obj))
}

/// A read-only view of `obj` as a C-contiguous array of `T`, converting
/// (with NumPy's `ascontiguousarray`) only when needed. Numeric inputs of
/// another dtype are cast; non-numeric ones raise `TypeError` naming `arg`.
pub fn input<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<PyReadonlyArrayDyn<'py, T>> {
    let py = obj.py();
    if let Ok(a) = obj.cast::<PyArrayDyn<T>>() {
        if a.is_c_contiguous() {
            return a.try_readonly().map_err(|e| invalid(arg, e));
        }
    }
    let expected = numpy::dtype::<T>(py);
    // Non-arrays are first converted as NumPy sees them, so that None (NaN
    // once cast to float) or a string ("1.5") is a TypeError, not a number.
    let np = numpy_module(py)?;
    let as_array;
    let obj = if obj.cast::<PyUntypedArray>().is_ok() {
        obj
    } else {
        as_array = np.call_method1("asarray", (obj,)).map_err(|e| {
            PyTypeError::new_err(format!(
                "{arg}: expected an array-like convertible to {expected}, got {} ({e})",
                type_name(obj)
            ))
        })?;
        &as_array
    };
    if let Ok(u) = obj.cast::<PyUntypedArray>() {
        let kind = u.dtype().kind();
        if !matches!(kind, b'f' | b'i' | b'u' | b'b') {
            return Err(wrong_dtype(arg, &expected.to_string(), u.dtype()));
        }
    }
    let converted = np
        .call_method1("ascontiguousarray", (obj, expected.clone()))
        .map_err(|e| {
            PyTypeError::new_err(format!(
                "{arg}: expected an array-like convertible to {expected}, got {} ({e})",
                type_name(obj)
            ))
        })?;
    let arr = converted.cast_into::<PyArrayDyn<T>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{arg}: could not convert to an array of {expected}"
        ))
    })?;
    arr.try_readonly().map_err(|e| invalid(arg, e))
}

/// A writable, C-contiguous array of exactly `T`, updated in place.
pub fn inplace<'py, T: Element>(
    obj: &Bound<'py, PyAny>,
    arg: &str,
) -> PyResult<PyReadwriteArrayDyn<'py, T>> {
    let py = obj.py();
    let expected = numpy::dtype::<T>(py).to_string();
    let Ok(u) = obj.cast::<PyUntypedArray>() else {
        return Err(wrong_type(
            arg,
            &format!("a writable numpy.ndarray of dtype {expected}"),
            obj,
        ));
    };
    let Ok(a) = obj.cast::<PyArrayDyn<T>>() else {
        return Err(wrong_dtype(arg, &expected, dtype_name(u.as_any())));
    };
    if !a.is_c_contiguous() {
        return Err(invalid(
            arg,
            "expected a C-contiguous array (it is updated in place; pass np.ascontiguousarray(...) and use the result)",
        ));
    }
    a.try_readwrite().map_err(|e| {
        let text = e.to_string();
        if text.contains("not writeable") || text.contains("not writable") {
            invalid(arg, "the array is read-only; it is updated in place")
        } else {
            invalid(
                arg,
                format!("the array overlaps another argument that is read or written ({text})"),
            )
        }
    })
}

/// Check `shape == expected`, naming the argument.
pub fn check_shape(arg: &str, actual: &[usize], expected: &[usize]) -> PyResult<()> {
    if actual != expected {
        return Err(QuantError::dims(arg, format!("{expected:?}"), format!("{actual:?}")).into());
    }
    Ok(())
}

/// True when the two buffers overlap in memory.
pub fn overlaps<A, B>(a: &[A], b: &[B]) -> bool {
    let (a0, a1) = (
        a.as_ptr() as usize,
        a.as_ptr() as usize + std::mem::size_of_val(a),
    );
    let (b0, b1) = (
        b.as_ptr() as usize,
        b.as_ptr() as usize + std::mem::size_of_val(b),
    );
    a0 < b1 && b0 < a1 && !a.is_empty() && !b.is_empty()
}
