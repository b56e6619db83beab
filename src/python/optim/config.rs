//! `Adam4bitOptimizerConfig`, `AdvancedQuantizationConfig` and
//! `QuantizationMethod`, and the float conversions the optimizer classes share.
//!
//! Each config's fields are listed once, in its `config_class_methods!`
//! table: the getters, `repr`, pickling and the optimizers' `config()` all
//! come from it.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::error::QuantError;
use crate::optim::{
    Adam4bitOptimizerConfig as CoreOptCfg, AdvancedQuantizationConfig as CoreQCfg,
    QuantizationMethod as Method, VarianceMap,
};
use crate::python::errors::invalid;
use crate::python::fields::{config_class_methods, field_values, set_fields, Field, PyValue};

/// f32 as the Python float with the same shortest decimal (so `1e-3` reads back as `0.001`).
pub(super) fn pyf(x: f32) -> f64 {
    x.py_value()
}

/// Python float -> f32, rejecting values that do not fit.
pub(super) fn f32_arg(name: &str, x: f64) -> PyResult<f32> {
    let y = x as f32;
    if x.is_finite() && !y.is_finite() {
        return Err(invalid(name, format!("{x} does not fit in float32")));
    }
    Ok(y)
}

impl PyValue for Method {
    type Out = &'static str;
    fn py_value(&self) -> &'static str {
        self.name()
    }
}

impl PyValue for VarianceMap {
    type Out = &'static str;
    fn py_value(&self) -> &'static str {
        self.name()
    }
}

impl From<Method> for Field {
    fn from(m: Method) -> Field {
        Field::Str(m.name())
    }
}

impl From<VarianceMap> for Field {
    fn from(v: VarianceMap) -> Field {
        Field::Str(v.name())
    }
}

/// The code book of the first moment: `NF4` (the default), `INT4`,
/// `DYNAMIC` (signed dynamic-exponent) or `INT8`.
#[pyclass(
    name = "QuantizationMethod",
    module = "quantrs",
    eq,
    eq_int,
    from_py_object
)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)] // Python-style member names
pub enum PyMethod {
    NF4,
    INT4,
    DYNAMIC,
    INT8,
}

impl From<PyMethod> for Method {
    fn from(m: PyMethod) -> Method {
        match m {
            PyMethod::NF4 => Method::Nf4,
            PyMethod::INT4 => Method::Int4,
            PyMethod::DYNAMIC => Method::Dynamic,
            PyMethod::INT8 => Method::Int8,
        }
    }
}

fn method_arg(obj: &Bound<'_, PyAny>) -> PyResult<Method> {
    if let Ok(m) = obj.extract::<PyMethod>() {
        return Ok(m.into());
    }
    let s: String = obj.extract().map_err(|_| {
        crate::python::errors::wrong_type(
            "method",
            "a str ('nf4', 'int4', 'dynamic', 'int8') or a QuantizationMethod",
            obj,
        )
    })?;
    Ok(Method::parse(&s)?)
}

/// Adam hyper-parameters, in constructor order (stored as float32, as the
/// optimizer uses them; each reads back as the shortest float that rounds to it).
#[pyclass(
    name = "Adam4bitOptimizerConfig",
    module = "quantrs",
    frozen,
    from_py_object
)]
#[derive(Clone)]
pub struct PyOptCfg {
    pub inner: CoreOptCfg,
}

config_class_methods!(eq PyOptCfg(CoreOptCfg, "Adam4bitOptimizerConfig"), {
    learning_rate: f64 = "Step size.",
    beta1: f64 = "Decay rate of the first moment.",
    beta2: f64 = "Decay rate of the second moment.",
    epsilon: f64 = "Term added to the denominator.",
    weight_decay: f64 = "Weight decay (L2 for Adam4bit, decoupled for AdamW4bit).",
}, {
    /// Validate the hyper-parameters (`InvalidArgument` naming the first bad one).
    #[new]
    #[pyo3(signature = (learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0))]
    pub(super) fn new(
        #[pyo3(from_py_with = crate::python::scalars::float::learning_rate)] learning_rate: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::epsilon)] epsilon: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
    ) -> PyResult<Self> {
        let inner = CoreOptCfg {
            learning_rate: f32_arg("learning_rate", learning_rate)?,
            beta1: f32_arg("beta1", beta1)?,
            beta2: f32_arg("beta2", beta2)?,
            epsilon: f32_arg("epsilon", epsilon)?,
            weight_decay: f32_arg("weight_decay", weight_decay)?,
        };
        inner.validate()?;
        Ok(PyOptCfg { inner })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        (slf.get_type(), field_values(py, &slf.get().inner)?).into_pyobject(py)
    }
});

/// How the optimizer state is quantized: the first moment's code book,
/// block size, scale bounds, double quantization of the scales, the
/// second moment's normalization and value map.
#[pyclass(
    name = "AdvancedQuantizationConfig",
    module = "quantrs",
    frozen,
    from_py_object
)]
#[derive(Clone)]
pub struct PyQCfg {
    pub inner: CoreQCfg,
}

config_class_methods!(eq PyQCfg(CoreQCfg, "AdvancedQuantizationConfig"), {
    method: &'static str = "Code book of the first moment ('nf4', 'int4', 'dynamic' or 'int8').",
    block_size: usize = "Elements per scale block.",
    adaptation_rate: f64 = "Rate at which the block scales adapt.",
    min_scale: f64 = "Smallest block scale.",
    max_scale: f64 = "Largest block scale.",
    double_quantization: bool = "Whether the block scales are themselves quantized.",
    rank1_normalization: bool = "Whether the second moment uses rank-1 (row x column) normalization.",
    variance_map: &'static str = "Value map of the second moment's codes.",
}, {
    /// Validate the settings (`InvalidArgument` naming the first bad one).
    #[new]
    #[pyo3(signature = (method=None, block_size=64, adaptation_rate=0.01, min_scale=1e-8,
        max_scale=1e8, double_quantization=true, *, rank1_normalization=false,
        variance_map=None),
        text_signature = "(method='nf4', block_size=64, adaptation_rate=0.01, min_scale=1e-8, \
        max_scale=1e8, double_quantization=True, *, rank1_normalization=False, variance_map=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        method: Option<Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::sizes::block_size)] block_size: usize,
        #[pyo3(from_py_with = crate::python::scalars::float::adaptation_rate)] adaptation_rate: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::min_scale)] min_scale: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::max_scale)] max_scale: f64,
        #[pyo3(from_py_with = crate::python::scalars::flag::double_quantization)] double_quantization: bool,
        #[pyo3(from_py_with = crate::python::scalars::flag::rank1_normalization)] rank1_normalization: bool,
        #[pyo3(from_py_with = crate::python::scalars::opt_text::variance_map)] variance_map: Option<String>,
    ) -> PyResult<Self> {
        let variance_map = match variance_map {
            None => crate::optim::config::DEFAULT_VARIANCE_MAP,
            Some(s) => VarianceMap::parse(&s).ok_or_else(|| {
                QuantError::arg(format!(
                    "variance_map: expected one of 'linear', 'sqrt_linear', 'log', 'sqrt_log', got {s:?}"
                ))
            })?,
        };
        let inner = CoreQCfg {
            method: match method {
                None => Method::Nf4,
                Some(m) => method_arg(&m)?,
            },
            block_size,
            adaptation_rate: f32_arg("adaptation_rate", adaptation_rate)?,
            min_scale: f32_arg("min_scale", min_scale)?,
            max_scale: f32_arg("max_scale", max_scale)?,
            double_quantization,
            rank1_normalization,
            variance_map,
        };
        inner.validate()?;
        Ok(PyQCfg { inner })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let kwargs = PyDict::new(py);
        set_fields(&kwargs, &slf.get().inner)?;
        let partial = py.import("functools")?.getattr("partial")?;
        let f = partial.call((slf.get_type(),), Some(&kwargs))?;
        (f, PyTuple::empty(py))
            .into_pyobject(py)
            .map(Bound::into_any)
    }
});

/// An optimizer's whole configuration, as `config()` returns it: the Adam
/// hyper-parameters and the state quantization (the Rust `Adam4bitConfig`).
/// The hyper-parameters also read directly (`config().learning_rate`, as on
/// `Adam4bitOptimizerConfig`). `config_dict()` gives the same values as one
/// flat dict.
#[pyclass(name = "Adam4bitConfig", module = "quantrs", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyAdamCfg {
    pub inner: crate::optim::Adam4bitConfig,
}

#[pymethods]
impl PyAdamCfg {
    /// The Adam hyper-parameters.
    #[getter]
    fn optimizer(&self) -> PyOptCfg {
        PyOptCfg {
            inner: self.inner.optimizer,
        }
    }

    /// Step size (`optimizer.learning_rate`).
    #[getter]
    fn learning_rate(&self) -> f64 {
        pyf(self.inner.optimizer.learning_rate)
    }

    /// Decay rate of the first moment (`optimizer.beta1`).
    #[getter]
    fn beta1(&self) -> f64 {
        pyf(self.inner.optimizer.beta1)
    }

    /// Decay rate of the second moment (`optimizer.beta2`).
    #[getter]
    fn beta2(&self) -> f64 {
        pyf(self.inner.optimizer.beta2)
    }

    /// Term added to the denominator (`optimizer.epsilon`).
    #[getter]
    fn epsilon(&self) -> f64 {
        pyf(self.inner.optimizer.epsilon)
    }

    /// Weight decay (`optimizer.weight_decay`).
    #[getter]
    fn weight_decay(&self) -> f64 {
        pyf(self.inner.optimizer.weight_decay)
    }

    /// How the optimizer state is quantized.
    #[getter]
    fn quantization(&self) -> PyQCfg {
        PyQCfg {
            inner: self.inner.quantization,
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let py = slf.py();
        let this = slf.get();
        let o = Bound::new(py, this.optimizer())?.repr()?;
        let q = Bound::new(py, this.quantization())?.repr()?;
        Ok(format!("Adam4bitConfig(optimizer={o}, quantization={q})"))
    }
}
