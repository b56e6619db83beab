//! Array and rounding helpers shared by the `QuantParams` functions and
//! `QatOptimizer`.

use numpy::{Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn};
use pyo3::prelude::*;

use crate::python::arrays::input;
use crate::qat::{CounterRng, Rounding, RoundingMode};

/// Rounding for a one-off call: stochastic streams key on the seed (fresh
/// entropy when None) and step 0.
pub fn one_off_rounding(mode: RoundingMode, seed: Option<u64>) -> Rounding {
    match mode {
        RoundingMode::Nearest => Rounding::Nearest,
        RoundingMode::Stochastic => {
            let s = seed.unwrap_or_else(|| CounterRng::from_entropy().next_u64());
            Rounding::Stochastic {
                key: crate::qat::rng::stream_key(s, 0),
            }
        }
    }
}

/// A new array of `shape` owning `v` (no copy).
pub fn to_array<'py, T: Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    PyArray1::from_vec(py, v).reshape(shape)
}

/// Float input as f32 when it is float32, else as f64.
pub enum FloatIn<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F64(PyReadonlyArrayDyn<'py, f64>),
}

/// `obj` as float32 when it is a float32 array, else converted to float64.
pub fn float_input<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<FloatIn<'py>> {
    if obj.cast::<PyArrayDyn<f32>>().is_ok() {
        return Ok(FloatIn::F32(input::<f32>(obj, arg)?));
    }
    Ok(FloatIn::F64(input::<f64>(obj, arg)?))
}

/// `$body` with `$a` bound to the float32 or the float64 array of a
/// `FloatIn` (the body is compiled once per dtype).
macro_rules! on_float {
    ($x:expr, |$a:ident| $body:expr) => {
        match $x {
            $crate::python::qat::convert::FloatIn::F32($a) => $body,
            $crate::python::qat::convert::FloatIn::F64($a) => $body,
        }
    };
}
pub(super) use on_float;
