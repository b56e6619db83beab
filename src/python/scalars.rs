//! Float, bool, str, path, bytes and shape arguments (docs/errors.md).
//!
//! PyO3's own extraction raises "must be real number, not str" or "'int'
//! object is not an instance of 'str'" without the argument's name. Each
//! scalar argument of the bindings is therefore a `from_py_with` function
//! generated here, one per argument name, whose `TypeError` names the
//! argument, the expected type and the actual one: "lr: expected float, got
//! str". (Integer sizes live in `sizes.rs`, with their ranges.)
//!
//! What each kind accepts:
//! - float: a Python `float` or `int`, a NumPy scalar, anything with
//!   `__float__` (a 0-d array); not `bool`, as for integer arguments.
//! - bool: `bool` or `numpy.bool_` only (`0`, `"False"` and `None` are
//!   mistakes, not falsy values).
//! - str: `str` only.
//! - path: `str` or `os.PathLike`.
//! - bytes: `bytes`, `bytearray` or `memoryview`.
//! - shape: a list or tuple of ints in `[0, 2**40]`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyList, PyMemoryView, PyString, PyTuple};

use super::errors::{type_name, wrong_type};
use super::sizes::{int_in, MAX_ELEMS};

/// True for `bool` and `numpy.bool_`, which are not numbers here.
fn is_bool(obj: &Bound<'_, PyAny>) -> bool {
    obj.is_instance_of::<PyBool>() || matches!(type_name(obj).as_str(), "bool_" | "bool")
}

/// `obj` as a float, or a `TypeError` naming `arg`.
pub(crate) fn float_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<f64> {
    if !is_bool(obj) && !obj.is_instance_of::<PyString>() {
        if let Ok(v) = obj.extract::<f64>() {
            return Ok(v);
        }
    }
    Err(wrong_type(arg, "float", obj))
}

/// `obj` as a bool (`bool` or `numpy.bool_`), or a `TypeError` naming `arg`.
pub(crate) fn bool_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<bool> {
    if is_bool(obj) {
        if let Ok(v) = obj.extract::<bool>() {
            return Ok(v);
        }
    }
    Err(wrong_type(arg, "bool", obj))
}

/// `obj` as a str, or a `TypeError` naming `arg`.
pub(crate) fn str_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(wrong_type(arg, "str", obj)),
    }
}

/// Functions named after the argument, each calling `$conv` (the optional
/// forms pass `None` through).
macro_rules! named {
    ($conv:ident -> $ty:ty: $($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("The `", stringify!($name), "` argument (see the module notes).")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<$ty> {
                super::$conv(obj, stringify!($name))
            }
        )*
    };
    (opt $conv:ident -> $ty:ty: $($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("The `", stringify!($name), "` argument, or None.")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<Option<$ty>> {
                if obj.is_none() {
                    Ok(None)
                } else {
                    super::$conv(obj, stringify!($name)).map(Some)
                }
            }
        )*
    };
}

/// Float arguments.
pub(crate) mod float {
    use pyo3::prelude::*;
    named!(float_arg -> f64:
        lr, beta1, beta2, eps, weight_decay,
        learning_rate, epsilon, adaptation_rate, min_scale, max_scale,
        scale, absmax, min, max, clip_fraction, lo, hi, weight_scale_inv,
    );
}

/// Optional float arguments (None passes through).
pub(crate) mod opt_float {
    use pyo3::prelude::*;
    named!(opt float_arg -> f64: activation_scale);
}

/// Bool arguments.
pub(crate) mod flag {
    use pyo3::prelude::*;
    named!(bool_arg -> bool: saturate, double_quantization, rank1_normalization);
}

/// Str arguments.
pub(crate) mod text {
    use pyo3::prelude::*;
    named!(str_arg -> String: fmt, format, device, prefix, name, kind, activations);

    /// The `type` argument (a keyword in Rust).
    pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> PyResult<String> {
        super::str_arg(obj, "type")
    }
}

/// Optional str arguments (None passes through).
pub(crate) mod opt_text {
    use pyo3::prelude::*;
    named!(opt str_arg -> String: dtype, name, variance_map);
}

/// A `path` argument: `str` or `os.PathLike`.
pub(crate) fn path(obj: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    if obj.cast::<PyString>().is_ok() || obj.hasattr("__fspath__").unwrap_or(false) {
        if let Ok(p) = obj.extract::<PathBuf>() {
            return Ok(p);
        }
    }
    Err(wrong_type("path", "str or os.PathLike", obj))
}

/// A `shape` argument: a list or tuple of sizes.
pub(crate) fn shape(obj: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let items = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect::<Vec<_>>()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(wrong_type("shape", "a list or tuple of ints", obj));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, d)| int_in(d, &format!("shape[{i}]"), 0, MAX_ELEMS).map(|v| v as usize))
        .collect()
}

/// Run `f` on the bytes of a `bytes` (borrowed), `bytearray` or
/// `memoryview` (copied) argument named `arg`; anything else (an int above
/// all: `bytes(10**9)` is a gigabyte of zeros) is a `TypeError`.
pub(crate) fn with_bytes<R>(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    f: impl FnOnce(&[u8]) -> R,
) -> PyResult<R> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(f(&b.to_vec()));
    }
    if obj.cast::<PyMemoryView>().is_ok() {
        let b = obj.py().get_type::<PyBytes>().call1((obj,))?;
        return Ok(f(b.cast::<PyBytes>()?.as_bytes()));
    }
    Err(wrong_type(arg, "bytes, bytearray or memoryview", obj))
}
