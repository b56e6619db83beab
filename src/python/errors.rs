//! The one place where core errors become Python exceptions.
//!
//! The hierarchy (docs/errors.md) needs multiple inheritance
//! (`DimensionMismatch(QuantError, ValueError)`), which `create_exception!`
//! cannot express, so the classes are built once with `type(...)` when the
//! module loads and cached for the life of the interpreter.

use pyo3::exceptions::{
    PyException, PyNotImplementedError, PyOSError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::error::QuantError;

struct Classes {
    base: Py<PyType>,
    dimension_mismatch: Py<PyType>,
    invalid_state: Py<PyType>,
    invalid_argument: Py<PyType>,
    unsupported: Py<PyType>,
    serialization: Py<PyType>,
    cuda_not_available: Py<PyType>,
    gpu: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn make_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: &[Bound<'py, PyAny>],
    doc: &str,
) -> PyResult<Py<PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "quantrs")?;
    ns.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    let ty = py
        .get_type::<PyType>()
        .call1((name, bases, ns))?
        .cast_into::<PyType>()?;
    Ok(ty.unbind())
}

fn classes(py: Python<'_>) -> &Classes {
    CLASSES.get_or_init(py, || {
        build_classes(py).expect("creating quantrs exception classes")
    })
}

fn build_classes(py: Python<'_>) -> PyResult<Classes> {
    let base = make_class(
        py,
        "QuantError",
        &[py.get_type::<PyException>().into_any()],
        "Base class of every quantrs error.",
    )?;
    let b = || base.bind(py).clone().into_any();
    let value = || py.get_type::<PyValueError>().into_any();
    Ok(Classes {
        dimension_mismatch: make_class(
            py,
            "DimensionMismatch",
            &[b(), value()],
            "A shape or length disagrees with what the operation needs.",
        )?,
        invalid_state: make_class(
            py,
            "InvalidState",
            &[b(), value()],
            "The object is not in a state where the operation is possible.",
        )?,
        invalid_argument: make_class(
            py,
            "InvalidArgument",
            &[b(), value()],
            "A value is outside its domain.",
        )?,
        unsupported: make_class(
            py,
            "UnsupportedOperation",
            &[b(), py.get_type::<PyNotImplementedError>().into_any()],
            "The operation is not supported by this object.",
        )?,
        serialization: make_class(
            py,
            "SerializationError",
            &[b(), value()],
            "Bytes or a file that cannot be decoded.",
        )?,
        cuda_not_available: make_class(
            py,
            "CudaNotAvailable",
            &[b(), py.get_type::<PyRuntimeError>().into_any()],
            "No usable CUDA device (or a build without the `gpu` feature).",
        )?,
        gpu: make_class(
            py,
            "GpuError",
            &[b(), py.get_type::<PyRuntimeError>().into_any()],
            "A CUDA call failed.",
        )?,
        base,
    })
}

fn raise(ty: &Py<PyType>, py: Python<'_>, msg: String) -> PyErr {
    match ty.bind(py).call1((msg,)) {
        Ok(inst) => PyErr::from_value(inst),
        Err(e) => e,
    }
}

impl From<QuantError> for PyErr {
    fn from(err: QuantError) -> PyErr {
        Python::attach(|py| {
            let c = classes(py);
            let msg = err.to_string();
            match err {
                QuantError::DimensionMismatch { .. } => raise(&c.dimension_mismatch, py, msg),
                QuantError::InvalidState(_) => raise(&c.invalid_state, py, msg),
                QuantError::InvalidArgument(_) => raise(&c.invalid_argument, py, msg),
                QuantError::UnsupportedOperation(_) => raise(&c.unsupported, py, msg),
                QuantError::Serialization(_) => raise(&c.serialization, py, msg),
                QuantError::CudaNotAvailable(_) => raise(&c.cuda_not_available, py, msg),
                QuantError::Gpu(_) => raise(&c.gpu, py, msg),
                QuantError::Io(e) => {
                    // Keep the errno-specific subclass (FileNotFoundError, ...).
                    let kind_err: PyErr = e.into();
                    if kind_err.is_instance_of::<PyOSError>(py) {
                        kind_err
                    } else {
                        PyOSError::new_err(msg)
                    }
                }
            }
        })
    }
}

/// The Python type name of `obj` (`"list"`, `"ndarray"`), for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// `TypeError` for an argument of the wrong Python type, naming the
/// argument, what it accepts and the type it got.
pub fn wrong_type(arg: &str, expected: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "{arg}: expected {expected}, got {}",
        type_name(obj)
    ))
}

/// `TypeError` for a wrong dtype, naming the argument.
pub fn wrong_dtype(arg: &str, expected: &str, actual: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!("{arg}: expected dtype {expected}, got {actual}"))
}

/// A `ValueError` subclass (`quantrs.InvalidArgument`) naming the argument.
pub fn invalid(arg: &str, msg: impl std::fmt::Display) -> PyErr {
    QuantError::InvalidArgument(format!("{arg}: {msg}")).into()
}

/// Add the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let c = classes(py);
    m.add("QuantError", c.base.bind(py))?;
    m.add("DimensionMismatch", c.dimension_mismatch.bind(py))?;
    m.add("InvalidState", c.invalid_state.bind(py))?;
    m.add("InvalidArgument", c.invalid_argument.bind(py))?;
    m.add("UnsupportedOperation", c.unsupported.bind(py))?;
    m.add("SerializationError", c.serialization.bind(py))?;
    m.add("CudaNotAvailable", c.cuda_not_available.bind(py))?;
    m.add("GpuError", c.gpu.bind(py))?;
    Ok(())
}
