//! `StateMemoryStats` and `OptimizerState`: read-only reports of the
//! optimizer state.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::optim::StateMemoryStats as CoreStats;

/// Memory of the optimizer state, measured from the live buffers.
#[pyclass(
    name = "StateMemoryStats",
    module = "quantrs",
    frozen,
    get_all,
    from_py_object
)]
#[derive(Clone, PartialEq, Eq)]
pub struct PyStats {
    /// Elements of the first moment.
    momentum_elements: usize,
    /// Elements of the second moment.
    variance_elements: usize,
    /// Elements of a third moment (0: these optimizers keep none).
    third_moment_elements: usize,
    /// Bytes of every state buffer, codes and scales included.
    total_bytes: usize,
    /// Parameter elements the state covers.
    num_parameters: usize,
}

impl From<CoreStats> for PyStats {
    fn from(s: CoreStats) -> Self {
        PyStats {
            momentum_elements: s.momentum_elements,
            variance_elements: s.variance_elements,
            third_moment_elements: s.third_moment_elements,
            total_bytes: s.total_bytes,
            num_parameters: s.num_parameters,
        }
    }
}

#[pymethods]
impl PyStats {
    /// A report with the given counts (the optimizers build their own with
    /// `memory_usage()`).
    #[new]
    fn new(
        #[pyo3(from_py_with = crate::python::sizes::momentum_elements)] momentum_elements: usize,
        #[pyo3(from_py_with = crate::python::sizes::variance_elements)] variance_elements: usize,
        #[pyo3(from_py_with = crate::python::sizes::third_moment_elements)]
        third_moment_elements: usize,
        #[pyo3(from_py_with = crate::python::sizes::total_bytes)] total_bytes: usize,
        #[pyo3(from_py_with = crate::python::sizes::num_parameters)] num_parameters: usize,
    ) -> Self {
        PyStats {
            momentum_elements,
            variance_elements,
            third_moment_elements,
            total_bytes,
            num_parameters,
        }
    }

    /// State bytes per optimized element (0.0 without state).
    #[getter]
    fn bytes_per_parameter(&self) -> f64 {
        if self.num_parameters == 0 {
            0.0
        } else {
            self.total_bytes as f64 / self.num_parameters as f64
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "StateMemoryStats(momentum_elements={}, variance_elements={}, third_moment_elements={}, total_bytes={}, num_parameters={})",
            self.momentum_elements, self.variance_elements, self.third_moment_elements,
            self.total_bytes, self.num_parameters
        )
    }

    fn __eq__(&self, o: &Bound<'_, PyAny>) -> bool {
        o.extract::<PyStats>().is_ok_and(|o| o == *self)
    }
}

/// A read-only summary of the optimizer state.
#[pyclass(name = "OptimizerState", module = "quantrs", frozen, get_all)]
pub struct PyState {
    /// Steps taken.
    pub(super) step: u64,
    /// State key -> parameter shape.
    pub(super) params: Py<PyDict>,
    /// Bytes of every state buffer.
    pub(super) total_bytes: usize,
}

#[pymethods]
impl PyState {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "OptimizerState(step={}, params={}, total_bytes={})",
            self.step,
            self.params.bind(py).repr()?,
            self.total_bytes
        ))
    }
}
