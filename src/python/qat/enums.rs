//! `QuantTarget`, `QuantScheme`, `RoundingMode` and the arguments that
//! accept either the enum class or its string form.

use pyo3::prelude::*;
use pyo3::pyclass::boolean_struct::True;
use pyo3::PyClass;

use crate::fp8::Fp8Format;
use crate::python::errors::wrong_type;
use crate::python::fields::{Field, PyValue};
use crate::qat::{IntDtype, QuantScheme, QuantTarget, RoundingMode};

/// Quantization target of a `QatConfig`.
#[pyclass(module = "quantrs", name = "QuantTarget", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyQuantTarget {
    #[pyo3(name = "INT8")]
    Int8,
    #[pyo3(name = "INT4")]
    Int4,
    #[pyo3(name = "FP8_E4M3")]
    Fp8E4m3,
    #[pyo3(name = "FP8_E5M2")]
    Fp8E5m2,
}

/// Integer calibration scheme.
#[pyclass(module = "quantrs", name = "QuantScheme", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyQuantScheme {
    #[pyo3(name = "SYMMETRIC")]
    Symmetric,
    #[pyo3(name = "AFFINE")]
    Affine,
}

/// Rounding onto the grid.
#[pyclass(module = "quantrs", name = "RoundingMode", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyRoundingMode {
    #[pyo3(name = "NEAREST")]
    Nearest,
    #[pyo3(name = "STOCHASTIC")]
    Stochastic,
}

/// `From` both ways between an enum class and its core enum, the core
/// enum as a getter value (`PyValue`) and a config field (`Field`), and
/// the class's `value` / `str()`.
macro_rules! same_variants {
    ($py:ident, $core:ident, { $($p:ident <=> $c:pat => $ce:expr),* $(,)? }) => {
        impl From<$py> for $core {
            fn from(v: $py) -> $core {
                match v {
                    $($py::$p => $ce,)*
                }
            }
        }

        impl From<$core> for $py {
            fn from(v: $core) -> $py {
                match v {
                    $($c => $py::$p,)*
                }
            }
        }

        impl From<$core> for Field {
            fn from(v: $core) -> Field {
                Field::Str(v.name())
            }
        }

        impl PyValue for $core {
            type Out = $py;
            fn py_value(&self) -> $py {
                (*self).into()
            }
        }

        #[pymethods]
        impl $py {
            /// The string form, as arguments also accept it.
            #[getter]
            fn value(&self) -> &'static str {
                $core::from(*self).name()
            }

            fn __str__(&self) -> &'static str {
                self.value()
            }
        }
    };
}

same_variants!(PyQuantTarget, QuantTarget, {
    Int8 <=> QuantTarget::Int(IntDtype::Int8) => QuantTarget::Int(IntDtype::Int8),
    Int4 <=> QuantTarget::Int(IntDtype::Int4) => QuantTarget::Int(IntDtype::Int4),
    Fp8E4m3 <=> QuantTarget::Fp8(Fp8Format::E4M3) => QuantTarget::Fp8(Fp8Format::E4M3),
    Fp8E5m2 <=> QuantTarget::Fp8(Fp8Format::E5M2) => QuantTarget::Fp8(Fp8Format::E5M2),
});
same_variants!(PyQuantScheme, QuantScheme, {
    Symmetric <=> QuantScheme::Symmetric => QuantScheme::Symmetric,
    Affine <=> QuantScheme::Affine => QuantScheme::Affine,
});
same_variants!(PyRoundingMode, RoundingMode, {
    Nearest <=> RoundingMode::Nearest => RoundingMode::Nearest,
    Stochastic <=> RoundingMode::Stochastic => RoundingMode::Stochastic,
});

/// An argument given as the enum class `P` or its string form (parsed by `parse`).
fn enum_arg<P, C>(
    obj: &Bound<'_, PyAny>,
    arg: &str,
    class: &str,
    parse: fn(&str) -> crate::error::Result<C>,
) -> PyResult<C>
where
    P: PyClass<Frozen = True> + Sync + Copy + Into<C>,
{
    if let Ok(v) = obj.cast::<P>() {
        return Ok((*v.get()).into());
    }
    let s: String = obj
        .extract()
        .map_err(|_| wrong_type(arg, &format!("a str or quantrs.{class}"), obj))?;
    Ok(parse(&s)?)
}

/// A `target` argument: a `QuantTarget` or its string form.
pub fn target_arg(obj: &Bound<'_, PyAny>) -> PyResult<QuantTarget> {
    enum_arg::<PyQuantTarget, _>(obj, "target", "QuantTarget", QuantTarget::parse)
}

/// A `scheme` argument: a `QuantScheme` or its string form.
pub fn scheme_arg(obj: &Bound<'_, PyAny>) -> PyResult<QuantScheme> {
    enum_arg::<PyQuantScheme, _>(obj, "scheme", "QuantScheme", QuantScheme::parse)
}

/// A `rounding` argument: a `RoundingMode` or its string form.
pub fn rounding_arg(obj: &Bound<'_, PyAny>) -> PyResult<RoundingMode> {
    enum_arg::<PyRoundingMode, _>(obj, "rounding", "RoundingMode", RoundingMode::parse)
}

/// An integer target's dtype, or an error for FP8 targets.
pub fn int_dtype(t: QuantTarget, what: &str) -> PyResult<IntDtype> {
    match t {
        QuantTarget::Int(d) => Ok(d),
        QuantTarget::Fp8(_) => Err(crate::QuantError::arg(format!(
            "target: {what} needs an integer target ('int8' or 'int4'), got {:?}",
            t.name()
        ))
        .into()),
    }
}
