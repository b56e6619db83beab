//! Bindings of `quantrs.Adam4bit` / `quantrs.AdamW4bit` and their config and
//! statistics classes (SPEC section 6). Validation and conversion only; the
//! numerics are in `crate::optim`.

use std::collections::HashMap;
use std::path::PathBuf;

use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple, PyType};

use super::arrays::{check_shape, inplace, input, overlaps};
use super::errors::invalid;
use crate::error::QuantError;
use crate::optim::{
    checkpoint, Adam4bitConfig, Adam4bitCore, Adam4bitOptimizerConfig as CoreOptCfg,
    AdvancedQuantizationConfig as CoreQCfg, ParamMut, ParamRef, QuantizationMethod as Method,
    StateMemoryStats as CoreStats, VarianceMap,
};
use crate::st::{Dtype, OwnedTensor};

/// f32 as the Python float with the same shortest decimal (so `1e-3` reads back as `0.001`).
fn pyf(x: f32) -> f64 {
    format!("{x}").parse().unwrap_or(x as f64)
}

/// An f32 written like Python writes the float (`0.001`, `1e-8`).
fn fmt(x: f32) -> String {
    format!("{:?}", pyf(x))
}

/// Python float -> f32, rejecting values that do not fit.
fn f32_arg(name: &str, x: f64) -> PyResult<f32> {
    let y = x as f32;
    if x.is_finite() && !y.is_finite() {
        return Err(invalid(name, format!("{x} does not fit in float32")));
    }
    Ok(y)
}

/// The code book of the first moment.
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
        pyo3::exceptions::PyTypeError::new_err(
            "method: expected a str ('nf4', 'int4', 'dynamic', 'int8') or a QuantizationMethod",
        )
    })?;
    Ok(Method::parse(&s)?)
}

/// Adam hyper-parameters (seed order).
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

#[pymethods]
impl PyOptCfg {
    #[new]
    #[pyo3(signature = (learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0))]
    fn new(
        learning_rate: f64,
        beta1: f64,
        beta2: f64,
        epsilon: f64,
        weight_decay: f64,
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
    #[getter]
    fn learning_rate(&self) -> f64 {
        pyf(self.inner.learning_rate)
    }
    #[getter]
    fn beta1(&self) -> f64 {
        pyf(self.inner.beta1)
    }
    #[getter]
    fn beta2(&self) -> f64 {
        pyf(self.inner.beta2)
    }
    #[getter]
    fn epsilon(&self) -> f64 {
        pyf(self.inner.epsilon)
    }
    #[getter]
    fn weight_decay(&self) -> f64 {
        pyf(self.inner.weight_decay)
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "Adam4bitOptimizerConfig(learning_rate={}, beta1={}, beta2={}, epsilon={}, weight_decay={})",
            fmt(c.learning_rate), fmt(c.beta1), fmt(c.beta2), fmt(c.epsilon), fmt(c.weight_decay)
        )
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .extract::<PyOptCfg>()
            .is_ok_and(|o| o.inner == self.inner)
    }
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let c = slf.get().inner;
        let args = (
            pyf(c.learning_rate),
            pyf(c.beta1),
            pyf(c.beta2),
            pyf(c.epsilon),
            pyf(c.weight_decay),
        );
        (slf.get_type(), args).into_pyobject(slf.py())
    }
}

/// How the state is quantized.
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

#[pymethods]
impl PyQCfg {
    #[new]
    #[pyo3(signature = (method=None, block_size=64, adaptation_rate=0.01, min_scale=1e-8,
        max_scale=1e8, double_quantization=true, *, rank1_normalization=false,
        variance_map=None),
        text_signature = "(method='nf4', block_size=64, adaptation_rate=0.01, min_scale=1e-8, \
        max_scale=1e8, double_quantization=True, *, rank1_normalization=False, variance_map=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        method: Option<Bound<'_, PyAny>>,
        block_size: usize,
        adaptation_rate: f64,
        min_scale: f64,
        max_scale: f64,
        double_quantization: bool,
        rank1_normalization: bool,
        variance_map: Option<String>,
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
    #[getter]
    fn method(&self) -> &'static str {
        self.inner.method.name()
    }
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size
    }
    #[getter]
    fn adaptation_rate(&self) -> f64 {
        pyf(self.inner.adaptation_rate)
    }
    #[getter]
    fn min_scale(&self) -> f64 {
        pyf(self.inner.min_scale)
    }
    #[getter]
    fn max_scale(&self) -> f64 {
        pyf(self.inner.max_scale)
    }
    #[getter]
    fn double_quantization(&self) -> bool {
        self.inner.double_quantization
    }
    #[getter]
    fn rank1_normalization(&self) -> bool {
        self.inner.rank1_normalization
    }
    #[getter]
    fn variance_map(&self) -> &'static str {
        self.inner.variance_map.name()
    }
    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "AdvancedQuantizationConfig(method='{}', block_size={}, adaptation_rate={}, \
             min_scale={}, max_scale={}, double_quantization={}, rank1_normalization={}, \
             variance_map='{}')",
            c.method.name(),
            c.block_size,
            fmt(c.adaptation_rate),
            fmt(c.min_scale),
            fmt(c.max_scale),
            py_bool(c.double_quantization),
            py_bool(c.rank1_normalization),
            c.variance_map.name()
        )
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .extract::<PyQCfg>()
            .is_ok_and(|o| o.inner == self.inner)
    }
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let c = slf.get().inner;
        let kwargs = PyDict::new(py);
        kwargs.set_item("method", c.method.name())?;
        kwargs.set_item("block_size", c.block_size)?;
        kwargs.set_item("adaptation_rate", pyf(c.adaptation_rate))?;
        kwargs.set_item("min_scale", pyf(c.min_scale))?;
        kwargs.set_item("max_scale", pyf(c.max_scale))?;
        kwargs.set_item("double_quantization", c.double_quantization)?;
        kwargs.set_item("rank1_normalization", c.rank1_normalization)?;
        kwargs.set_item("variance_map", c.variance_map.name())?;
        let partial = py.import("functools")?.getattr("partial")?;
        let f = partial.call((slf.get_type(),), Some(&kwargs))?;
        (f, PyTuple::empty(py))
            .into_pyobject(py)
            .map(Bound::into_any)
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// Memory of the optimizer state, measured from the live buffers.
#[pyclass(
    name = "StateMemoryStats",
    module = "quantrs",
    frozen,
    get_all,
    from_py_object
)]
#[derive(Clone)]
pub struct PyStats {
    momentum_elements: usize,
    variance_elements: usize,
    third_moment_elements: usize,
    total_bytes: usize,
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
    #[new]
    fn new(
        momentum_elements: usize,
        variance_elements: usize,
        third_moment_elements: usize,
        total_bytes: usize,
        num_parameters: usize,
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
        o.extract::<PyStats>().is_ok_and(|o| {
            (
                o.momentum_elements,
                o.variance_elements,
                o.third_moment_elements,
            ) == (
                self.momentum_elements,
                self.variance_elements,
                self.third_moment_elements,
            ) && (o.total_bytes, o.num_parameters) == (self.total_bytes, self.num_parameters)
        })
    }
}

/// A read-only summary of the optimizer state.
#[pyclass(name = "OptimizerState", module = "quantrs", frozen, get_all)]
pub struct PyState {
    step: u64,
    /// State key -> parameter shape.
    params: Py<PyDict>,
    total_bytes: usize,
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

/// What both optimizer classes hold: the core and, for pending gradient
/// accumulation, the parameter arrays to update.
pub struct Inner {
    core: Adam4bitCore,
    accum_params: HashMap<String, Py<PyAny>>,
}

fn build(opt: Option<PyOptCfg>, q: Option<PyQCfg>, decoupled: bool) -> PyResult<Inner> {
    let config = Adam4bitConfig {
        optimizer: opt.map(|c| c.inner).unwrap_or_default(),
        quantization: q.map(|c| c.inner).unwrap_or_default(),
    };
    Ok(Inner {
        core: Adam4bitCore::new(config, decoupled)?,
        accum_params: HashMap::new(),
    })
}

impl Inner {
    fn update(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        name: Option<&str>,
    ) -> PyResult<()> {
        let g = input::<f32>(grad, "grad")?;
        let mut p = inplace::<f32>(param, "param")?;
        let shape = p.shape().to_vec();
        check_shape("grad", g.shape(), &shape)?;
        let gs = g.as_slice().map_err(|e| invalid("grad", e))?;
        let ps = p.as_slice_mut().map_err(|e| invalid("param", e))?;
        if overlaps(ps, gs) {
            return Err(invalid("grad", "must not share memory with param"));
        }
        let core = &mut self.core;
        py.detach(|| {
            core.update(
                ParamMut {
                    name,
                    shape: &shape,
                    data: ps,
                },
                gs,
            )
        })?;
        Ok(())
    }

    fn accumulate(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        name: Option<&str>,
    ) -> PyResult<()> {
        let g = input::<f32>(grad, "grad")?;
        // The parameter is updated later: it must already be a valid target.
        let p = inplace::<f32>(param, "param")?;
        let shape = p.shape().to_vec();
        check_shape("grad", g.shape(), &shape)?;
        let gs = g.as_slice().map_err(|e| invalid("grad", e))?;
        let ps = p.as_slice().map_err(|e| invalid("param", e))?;
        let core = &mut self.core;
        let key = py.detach(|| {
            core.accumulate_grad(
                ParamRef {
                    name,
                    shape: &shape,
                    data: ps,
                },
                gs,
            )
        })?;
        self.accum_params.insert(key, param.clone().unbind());
        Ok(())
    }

    fn apply_accumulated(&mut self, py: Python<'_>, steps: usize) -> PyResult<()> {
        let keys = self.core.accumulated_keys();
        let mut arrays = Vec::with_capacity(keys.len());
        for k in &keys {
            let obj = self.accum_params.get(k).ok_or_else(|| {
                QuantError::InvalidState(format!("no parameter recorded for {k:?}"))
            })?;
            arrays.push(inplace::<f32>(obj.bind(py), "param")?);
        }
        let shapes: Vec<Vec<usize>> = arrays.iter().map(|a| a.shape().to_vec()).collect();
        let mut params = Vec::with_capacity(keys.len());
        for ((k, a), s) in keys.iter().zip(arrays.iter_mut()).zip(&shapes) {
            let data = a.as_slice_mut().map_err(|e| invalid("param", e))?;
            params.push((
                k.clone(),
                ParamMut {
                    name: None,
                    shape: s,
                    data,
                },
            ));
        }
        let core = &mut self.core;
        py.detach(|| core.apply_accumulated_grads(steps, &mut params))?;
        self.accum_params.clear();
        Ok(())
    }

    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = checkpoint::to_tensors(&self.core)?;
        let d = PyDict::new(py);
        for (name, x) in t {
            let arr = match x.dtype {
                Dtype::U8 => PyArray1::from_vec(py, x.data).reshape(x.shape)?.into_any(),
                _ => PyArray1::from_vec(py, crate::st::le_to_f32(&x.data)?)
                    .reshape(x.shape)?
                    .into_any(),
            };
            d.set_item(name, arr)?;
        }
        Ok(d)
    }

    fn load_state_dict(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut t = checkpoint::Tensors::new();
        for (k, v) in state.iter() {
            let name: String = k
                .extract()
                .map_err(|_| QuantError::ser("state_dict: keys must be str".to_string()))?;
            let tensor = if let Ok(a) = v.cast::<numpy::PyArrayDyn<u8>>() {
                let r = a.try_readonly().map_err(|e| invalid(&name, e))?;
                OwnedTensor {
                    dtype: Dtype::U8,
                    shape: r.shape().to_vec(),
                    data: r.as_array().iter().copied().collect(),
                }
            } else if let Ok(a) = v.cast::<numpy::PyArrayDyn<f32>>() {
                let r = a.try_readonly().map_err(|e| invalid(&name, e))?;
                let vals: Vec<f32> = r.as_array().iter().copied().collect();
                OwnedTensor {
                    dtype: Dtype::F32,
                    shape: r.shape().to_vec(),
                    data: crate::st::f32_to_le(&vals),
                }
            } else {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "state_dict[{name:?}]: expected a numpy array of dtype uint8 or float32, got {}",
                    v.get_type().name()?
                )));
            };
            t.insert(name, tensor);
        }
        checkpoint::load_tensors(&mut self.core, t)?;
        self.accum_params.clear();
        Ok(())
    }

    fn config_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.core.config();
        let (o, q) = (&c.optimizer, &c.quantization);
        let d = PyDict::new(py);
        d.set_item("learning_rate", pyf(o.learning_rate))?;
        d.set_item("beta1", pyf(o.beta1))?;
        d.set_item("beta2", pyf(o.beta2))?;
        d.set_item("epsilon", pyf(o.epsilon))?;
        d.set_item("weight_decay", pyf(o.weight_decay))?;
        d.set_item("method", q.method.name())?;
        d.set_item("block_size", q.block_size)?;
        d.set_item("adaptation_rate", pyf(q.adaptation_rate))?;
        d.set_item("min_scale", pyf(q.min_scale))?;
        d.set_item("max_scale", pyf(q.max_scale))?;
        d.set_item("double_quantization", q.double_quantization)?;
        d.set_item("rank1_normalization", q.rank1_normalization)?;
        d.set_item("variance_map", q.variance_map.name())?;
        Ok(d)
    }

    fn state(&self, py: Python<'_>) -> PyResult<PyState> {
        let s = self.core.state();
        let d = PyDict::new(py);
        for (k, p) in &s.params {
            d.set_item(k, PyTuple::new(py, &p.shape)?)?;
        }
        Ok(PyState {
            step: s.step,
            params: d.unbind(),
            total_bytes: s.bytes(),
        })
    }

    fn repr(&self, cls: &str) -> String {
        let c = self.core.config();
        let o = &c.optimizer;
        let head = format!(
            "learning_rate={}, beta1={}, beta2={}, epsilon={}, weight_decay={}",
            fmt(o.learning_rate),
            fmt(o.beta1),
            fmt(o.beta2),
            fmt(o.epsilon),
            fmt(o.weight_decay)
        );
        if c.quantization == CoreQCfg::default() {
            format!("{cls}({head})")
        } else {
            format!(
                "{cls}.with_quantization_config(Adam4bitOptimizerConfig({head}), {})",
                PyQCfg {
                    inner: c.quantization
                }
                .__repr__()
            )
        }
    }
}

macro_rules! py_optimizer {
    ($ty:ident, $name:literal, $decoupled:expr, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(name = $name, module = "quantrs")]
        pub struct $ty {
            inner: Inner,
        }

        #[pymethods]
        impl $ty {
            #[new]
            #[pyo3(signature = (learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0))]
            fn new(
                learning_rate: f64,
                beta1: f64,
                beta2: f64,
                epsilon: f64,
                weight_decay: f64,
            ) -> PyResult<Self> {
                let o = PyOptCfg::new(learning_rate, beta1, beta2, epsilon, weight_decay)?;
                Ok($ty {
                    inner: build(Some(o), None, $decoupled)?,
                })
            }

            /// An optimizer with explicit hyper-parameters and quantization.
            #[classmethod]
            #[pyo3(signature = (optimizer_config=None, quantization_config=None))]
            fn with_quantization_config(
                _cls: &Bound<'_, PyType>,
                optimizer_config: Option<PyOptCfg>,
                quantization_config: Option<PyQCfg>,
            ) -> PyResult<Self> {
                Ok($ty {
                    inner: build(optimizer_config, quantization_config, $decoupled)?,
                })
            }

            /// Update `param` (float32, writable, C-contiguous) in place.
            #[pyo3(signature = (param, grad, *, name=None))]
            fn update(
                &mut self,
                py: Python<'_>,
                param: &Bound<'_, PyAny>,
                grad: &Bound<'_, PyAny>,
                name: Option<&str>,
            ) -> PyResult<()> {
                self.inner.update(py, param, grad, name)
            }

            fn zero_grad(&mut self) {
                self.inner.core.zero_grad();
                self.inner.accum_params.clear();
            }

            fn step(&mut self) {
                self.inner.core.step()
            }

            #[getter(lr)]
            fn get_lr_prop(&self) -> f64 {
                pyf(self.inner.core.get_lr())
            }

            fn get_lr(&self) -> f64 {
                pyf(self.inner.core.get_lr())
            }

            fn set_lr(&mut self, lr: f64) -> PyResult<()> {
                Ok(self.inner.core.set_lr(f32_arg("lr", lr)?)?)
            }

            #[setter(lr)]
            fn set_lr_prop(&mut self, lr: f64) -> PyResult<()> {
                self.set_lr(lr)
            }

            #[pyo3(signature = (param, grad, *, name=None))]
            fn accumulate_grad(
                &mut self,
                py: Python<'_>,
                param: &Bound<'_, PyAny>,
                grad: &Bound<'_, PyAny>,
                name: Option<&str>,
            ) -> PyResult<()> {
                self.inner.accumulate(py, param, grad, name)
            }

            fn apply_accumulated_grads(
                &mut self,
                py: Python<'_>,
                accumulation_steps: usize,
            ) -> PyResult<()> {
                self.inner.apply_accumulated(py, accumulation_steps)
            }

            fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                self.inner.state_dict(py)
            }

            fn load_state_dict(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
                self.inner.load_state_dict(state)
            }

            fn memory_usage(&self) -> PyStats {
                self.inner.core.memory_usage().into()
            }

            fn memory_savings(&self) -> f64 {
                self.inner.core.memory_savings() as f64
            }

            fn save_state(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
                let core = &self.inner.core;
                Ok(py.detach(|| checkpoint::save(core, &path))?)
            }

            fn load_state(&mut self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
                let core = &mut self.inner.core;
                py.detach(|| checkpoint::load(core, &path))?;
                self.inner.accum_params.clear();
                Ok(())
            }

            fn reset_state(&mut self) {
                self.inner.core.reset_state();
                self.inner.accum_params.clear();
            }

            fn num_parameters(&self) -> usize {
                self.inner.core.num_parameters()
            }

            fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                self.inner.config_dict(py)
            }

            fn state(&self, py: Python<'_>) -> PyResult<PyState> {
                self.inner.state(py)
            }

            fn __repr__(&self) -> String {
                self.inner.repr($name)
            }

            fn __getstate__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
                let bytes = checkpoint::to_bytes(&self.inner.core)?;
                Ok(PyBytes::new(py, &bytes))
            }

            fn __setstate__(&mut self, state: &Bound<'_, PyBytes>) -> PyResult<()> {
                let f = crate::st::from_bytes(state.as_bytes())?;
                let t: checkpoint::Tensors = f.tensors.into_iter().collect();
                let (config, st) = checkpoint::parse(t, $name)?;
                let mut core = Adam4bitCore::new(config, $decoupled)?;
                core.restore(config, st);
                self.inner = Inner {
                    core,
                    accum_params: HashMap::new(),
                };
                Ok(())
            }
        }
    };
}

py_optimizer!(
    PyAdam4bit,
    "Adam4bit",
    false,
    "4-bit Adam: L2 weight decay folded into the gradient (g += wd * w)."
);
py_optimizer!(
    PyAdamW4bit,
    "AdamW4bit",
    true,
    "4-bit AdamW: decoupled weight decay (w -= lr * wd * w), as PyTorch's AdamW."
);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMethod>()?;
    m.add_class::<PyOptCfg>()?;
    m.add_class::<PyQCfg>()?;
    m.add_class::<PyStats>()?;
    m.add_class::<PyState>()?;
    m.add_class::<PyAdam4bit>()?;
    m.add_class::<PyAdamW4bit>()?;
    Ok(())
}
