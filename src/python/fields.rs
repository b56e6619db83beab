//! How the fields of core structs read in Python: the getters
//! (`PyValue`, `pymethods_with_getters!`) and, for the config classes, the
//! one field list (`ConfigFields`) that their `repr`, pickling and dicts read.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// How a field of a core struct reads in Python (the enum fields implement
/// it next to their Python classes).
pub(crate) trait PyValue {
    /// The type the Python property returns.
    type Out;
    /// The Python-facing value.
    fn py_value(&self) -> Self::Out;
}

/// Fields that read back unchanged.
macro_rules! as_is {
    ($($t:ty),*) => {
        $(impl PyValue for $t {
            type Out = $t;
            fn py_value(&self) -> $t {
                *self
            }
        })*
    };
}
as_is!(f64, i32, usize, bool);

/// float32 fields read back as the Python float with the same shortest
/// decimal (so a learning rate of `1e-3` reads `0.001`, not
/// `0.0010000000474974513`).
impl PyValue for f32 {
    type Out = f64;
    fn py_value(&self) -> f64 {
        format!("{self}").parse().unwrap_or(*self as f64)
    }
}

/// One config field as Python sees it.
#[derive(Clone, Copy)]
pub(crate) enum Field {
    /// A float32 setting, read back as its shortest Python float.
    F32(f32),
    /// A float64 setting.
    F64(f64),
    /// An integer setting.
    Int(usize),
    /// A flag.
    Bool(bool),
    /// A name (method, target, ...).
    Str(&'static str),
}

impl Field {
    /// The value as a config's `repr` writes it (`0.001`, `1e-8`, `True`, `'nf4'`).
    fn repr(self) -> String {
        match self {
            Field::F32(x) => format!("{:?}", x.py_value()),
            Field::F64(x) => format!("{x:?}"),
            Field::Int(n) => n.to_string(),
            Field::Bool(b) => if b { "True" } else { "False" }.to_string(),
            Field::Str(s) => format!("'{s}'"),
        }
    }

    /// The Python value.
    fn to_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        Ok(match self {
            Field::F32(x) => x.py_value().into_pyobject(py)?.into_any(),
            Field::F64(x) => x.into_pyobject(py)?.into_any(),
            Field::Int(n) => n.into_pyobject(py)?.into_any(),
            Field::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Field::Str(s) => s.into_pyobject(py)?.into_any(),
        })
    }
}

/// Primitive fields as `Field`s (the enum fields convert next to their
/// Python classes, to `Field::Str` of their names).
macro_rules! field_from {
    ($($t:ty => $v:ident),*) => {
        $(impl From<$t> for Field {
            fn from(x: $t) -> Field {
                Field::$v(x)
            }
        })*
    };
}
field_from!(f32 => F32, f64 => F64, usize => Int, bool => Bool);

/// A core config with a Python class: its fields in constructor order
/// (implemented by `config_class_methods!`).
pub(crate) trait ConfigFields {
    /// The Python class name.
    const CLASS: &'static str;
    /// `(name, value)` in constructor order.
    fn fields(&self) -> Vec<(&'static str, Field)>;
}

/// `name=value, ...`.
pub(crate) fn fields_repr<C: ConfigFields>(c: &C) -> String {
    let parts: Vec<String> = c
        .fields()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.repr()))
        .collect();
    parts.join(", ")
}

/// `Class(name=value, ...)`: the call that rebuilds the config.
pub(crate) fn class_repr<C: ConfigFields>(c: &C) -> String {
    format!("{}({})", C::CLASS, fields_repr(c))
}

/// Set every field as a key of `d`.
pub(crate) fn set_fields<C: ConfigFields>(d: &Bound<'_, PyDict>, c: &C) -> PyResult<()> {
    for (k, v) in c.fields() {
        d.set_item(k, v.to_py(d.py())?)?;
    }
    Ok(())
}

/// The field values as a tuple: the constructor's positional arguments.
pub(crate) fn field_values<'py, C: ConfigFields>(
    py: Python<'py>,
    c: &C,
) -> PyResult<Bound<'py, PyTuple>> {
    let values = c
        .fields()
        .iter()
        .map(|(_, v)| v.to_py(py))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, values)
}

/// `pymethods_with_getters!(Class, { field: PyType = "doc", ... }, { other methods })`:
/// the class's `#[pymethods]` block, starting with one documented read-only
/// property per field of `self.inner`. pyo3 reads one `#[pymethods]` block
/// per class, so the getters go into the class's only block.
macro_rules! pymethods_with_getters {
    ($ty:ident, { $($f:ident: $t:ty = $doc:literal,)* }, { $($rest:tt)* }) => {
        #[pymethods]
        impl $ty {
            $(
                #[doc = $doc]
                #[getter]
                fn $f(&self) -> $t {
                    $crate::python::fields::PyValue::py_value(&self.inner.$f)
                }
            )*
            $($rest)*
        }
    };
}
pub(crate) use pymethods_with_getters;

/// `config_class_methods!([eq] Class(CoreConfig, "PythonName"), { field: PyType = "doc", ... }, { other methods })`:
/// `pymethods_with_getters!` plus `ConfigFields` for the core config, both
/// from the one field table (in constructor order), and `__repr__` (the
/// call that rebuilds the config); with `eq`, an `__eq__` comparing the
/// core configs (False, not NotImplemented, for other types).
macro_rules! config_class_methods {
    (eq $ty:ident($core:ty, $class:literal), $fields:tt, { $($rest:tt)* }) => {
        $crate::python::fields::config_class_methods!($ty($core, $class), $fields, {
            fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
                other.extract::<Self>().is_ok_and(|o| o.inner == self.inner)
            }

            $($rest)*
        });
    };
    ($ty:ident($core:ty, $class:literal), { $($f:ident: $t:ty = $doc:literal,)* }, { $($rest:tt)* }) => {
        impl $crate::python::fields::ConfigFields for $core {
            const CLASS: &'static str = $class;
            fn fields(&self) -> Vec<(&'static str, $crate::python::fields::Field)> {
                vec![$((stringify!($f), self.$f.into()),)*]
            }
        }

        $crate::python::fields::pymethods_with_getters!($ty, { $($f: $t = $doc,)* }, {
            fn __repr__(&self) -> String {
                $crate::python::fields::class_repr(&self.inner)
            }

            $($rest)*
        });
    };
}
pub(crate) use config_class_methods;
