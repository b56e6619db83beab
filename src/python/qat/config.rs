//! `QatConfig`: the configuration of a `QatOptimizer`.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::enums::{
    rounding_arg, scheme_arg, target_arg, PyQuantScheme, PyQuantTarget, PyRoundingMode,
};
use crate::python::fields::{config_class_methods, field_values};
use crate::qat::QatConfig;

/// Configuration of a `QatOptimizer` (docs/qat.md): target, scheme,
/// rounding and the AdamW hyper-parameters.
#[pyclass(module = "quantrs", name = "QatConfig", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyQatConfig {
    pub inner: QatConfig,
}

config_class_methods!(PyQatConfig(QatConfig, "QatConfig"), {
    target: PyQuantTarget = "Quantization target.",
    scheme: PyQuantScheme = "Integer calibration scheme.",
    rounding: PyRoundingMode = "Rounding onto the grid.",
    lr: f64 = "AdamW learning rate.",
    beta1: f64 = "Decay rate of the first moment.",
    beta2: f64 = "Decay rate of the second moment.",
    eps: f64 = "Term added to the denominator.",
    weight_decay: f64 = "Decoupled weight decay.",
}, {
    /// Validate the configuration (`InvalidArgument` naming the first bad value).
    #[new]
    #[pyo3(
        signature = (target, scheme = None, rounding = None, lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0),
        text_signature = "(target, scheme='symmetric', rounding='nearest', lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        target: &Bound<'_, PyAny>,
        scheme: Option<&Bound<'_, PyAny>>,
        rounding: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::eps)] eps: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
    ) -> PyResult<Self> {
        let mut c = QatConfig::with_target(target_arg(target)?);
        if let Some(s) = scheme {
            c.scheme = scheme_arg(s)?;
        }
        if let Some(r) = rounding {
            c.rounding = rounding_arg(r)?;
        }
        (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) = (lr, beta1, beta2, eps, weight_decay);
        c.validate()?;
        Ok(PyQatConfig { inner: c })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        (slf.get_type(), field_values(py, &slf.get().inner)?).into_pyobject(py)
    }
});
