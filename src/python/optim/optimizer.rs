//! `quantrs.Adam4bit` and `quantrs.AdamW4bit`: one macro writes both
//! classes, which differ only in how weight decay is applied. Each object
//! holds its state on the host or on a CUDA device (`backend.rs`);
//! `.to(device)` moves it in place.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use super::backend::Backend;
use super::config::{f32_arg, pyf, PyAdamCfg, PyOptCfg, PyQCfg};
use super::state::{config_dict, repr, Inner, Pair};
use super::stats::{PyState, PyStats};
use crate::optim::{checkpoint, Adam4bitCore};

macro_rules! py_optimizer {
    ($ty:ident, $name:literal, $decoupled:expr, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(name = $name, module = "quantrs")]
        pub struct $ty {
            pub(super) backend: Backend,
        }

        #[pymethods]
        impl $ty {
            /// An optimizer with these hyper-parameters and the default
            /// state quantization (NF4 first moment, blocks of 64).
            #[new]
            #[pyo3(signature = (learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0))]
            fn new(
                #[pyo3(from_py_with = crate::python::scalars::float::learning_rate)] learning_rate: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::epsilon)] epsilon: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
            ) -> PyResult<Self> {
                let o = PyOptCfg::new(learning_rate, beta1, beta2, epsilon, weight_decay)?;
                Ok($ty {
                    backend: Backend::Cpu(Inner::build(Some(o), None, $decoupled)?),
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
                    backend: Backend::Cpu(Inner::build(optimizer_config, quantization_config, $decoupled)?),
                })
            }

            /// Update `param` (float32, writable, C-contiguous; a CUDA array on
            /// the optimizer's device when it is on one) in place with `grad`;
            /// `name` keys the state (default: the array's memory).
            #[pyo3(signature = (param, grad, *, name=None))]
            fn update(
                &mut self,
                py: Python<'_>,
                param: &Bound<'_, PyAny>,
                grad: &Bound<'_, PyAny>,
                #[pyo3(from_py_with = crate::python::scalars::opt_text::name)] name: Option<String>,
            ) -> PyResult<()> {
                let name = name.as_deref();
                on_backend!(&mut self.backend,
                    i => i.update(py, Pair::new(param, grad)?, name),
                    c => c.update(py, param, grad, name))
            }

            /// Drop accumulated gradients (the moments are kept).
            fn zero_grad(&mut self) {
                on_backend!(&mut self.backend, i => {
                    i.core.zero_grad();
                    i.forget_params();
                }, c => c.zero_grad())
            }

            /// Advance the step counter used by the bias correction of the next updates.
            fn step(&mut self) {
                on_backend!(&mut self.backend, i => i.core.step(), c => c.step())
            }

            /// The learning rate (settable; validated as `set_lr`).
            #[getter(lr)]
            fn get_lr_prop(&self) -> f64 {
                self.get_lr()
            }

            /// The current learning rate.
            fn get_lr(&self) -> f64 {
                pyf(self.backend.get_lr())
            }

            /// Set the learning rate (finite and >= 0, else `InvalidArgument`).
            fn set_lr(&mut self, #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64) -> PyResult<()> {
                self.backend.set_lr(f32_arg("lr", lr)?)
            }

            #[setter(lr)]
            fn set_lr_prop(&mut self, lr: &Bound<'_, PyAny>) -> PyResult<()> {
                self.set_lr(crate::python::scalars::float::lr(lr)?)
            }

            /// Add `grad` to `param`'s accumulator; `param` is updated by
            /// `apply_accumulated_grads`.
            #[pyo3(signature = (param, grad, *, name=None))]
            fn accumulate_grad(
                &mut self,
                py: Python<'_>,
                param: &Bound<'_, PyAny>,
                grad: &Bound<'_, PyAny>,
                #[pyo3(from_py_with = crate::python::scalars::opt_text::name)] name: Option<String>,
            ) -> PyResult<()> {
                let name = name.as_deref();
                on_backend!(&mut self.backend,
                    i => i.accumulate(py, param, Pair::new(param, grad)?, name),
                    c => c.accumulate(py, param, grad, name))
            }

            /// Update every accumulated parameter with its summed gradient
            /// divided by `accumulation_steps`, then clear the accumulators.
            fn apply_accumulated_grads(
                &mut self,
                py: Python<'_>,
                #[pyo3(from_py_with = crate::python::sizes::accumulation_steps)] accumulation_steps: usize,
            ) -> PyResult<()> {
                on_backend!(&mut self.backend,
                    i => i.apply_accumulated(py, accumulation_steps),
                    c => c.apply_accumulated(py, accumulation_steps))
            }

            /// The state as a dict of NumPy arrays (uint8 codes, float32 values;
            /// host copies of a device state).
            fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                self.backend.read_host(py, |i| i.state_dict(py))
            }

            /// Replace the state with `state_dict()` output, validated first.
            fn load_state_dict(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
                let state = state
                    .cast::<PyDict>()
                    .map_err(|_| crate::python::errors::wrong_type("state", "dict", state))?;
                self.backend.with_host(py, |i| i.load_state_dict(state))
            }

            /// Elements and bytes of the state, measured from the live buffers.
            fn memory_usage(&self) -> PyStats {
                on_backend!(&self.backend, i => i.core.memory_usage(), c => c.memory_usage()).into()
            }

            /// `1 - state bytes / (8 bytes per element)`: the saving against
            /// two float32 moments (0.0 before any state exists).
            fn memory_savings(&self) -> f64 {
                on_backend!(&self.backend, i => i.core.memory_savings() as f64, c => {
                    let m = c.memory_usage();
                    if m.num_parameters == 0 {
                        0.0
                    } else {
                        1.0 - m.total_bytes as f64 / (8.0 * m.num_parameters as f64)
                    }
                })
            }

            /// Write config and state to a safetensors file, atomically.
            fn save_state(
                &self,
                py: Python<'_>,
                #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
            ) -> PyResult<()> {
                self.backend.read_host(py, |i| {
                    let core = &i.core;
                    Ok(py.detach(|| checkpoint::save(core, &path))?)
                })
            }

            /// Replace config and state with a `save_state` file's (validated first).
            fn load_state(
                &mut self,
                py: Python<'_>,
                #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
            ) -> PyResult<()> {
                self.backend.with_host(py, |i| {
                    let core = &mut i.core;
                    py.detach(|| checkpoint::load(core, &path))?;
                    i.forget_params();
                    Ok(())
                })
            }

            /// Drop all state: moments, accumulators, step count, parameter keys.
            fn reset_state(&mut self) {
                on_backend!(&mut self.backend, i => {
                    i.core.reset_state();
                    i.forget_params();
                }, c => c.reset_state())
            }

            /// Parameter elements with state.
            fn num_parameters(&self) -> usize {
                on_backend!(&self.backend, i => i.core.num_parameters(), c => c.num_parameters())
            }

            /// The configuration object (`Adam4bitConfig`: `.optimizer`,
            /// `.quantization`), as the Rust `StatefulOptimizer::config`.
            fn config(&self) -> PyAdamCfg {
                PyAdamCfg {
                    inner: *self.backend.config(),
                }
            }

            /// Every hyper-parameter and quantization setting as one dict.
            fn config_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                config_dict(py, self.backend.config())
            }

            /// A read-only summary: step, parameter shapes, state bytes.
            fn state(&self, py: Python<'_>) -> PyResult<PyState> {
                self.backend.read_host(py, |i| i.state(py))
            }

            /// Where the state lives: `"cpu"` or `"cuda:N"`.
            #[getter]
            fn device(&self) -> String {
                self.backend.device().name()
            }

            /// Move the state (and so the updates) to `device` ("cpu", "cuda",
            /// "cuda:N") in place, as `torch.nn.Module.to` does, and return
            /// this optimizer. On a device, parameters and gradients are CUDA
            /// arrays there (a torch.cuda tensor, a CuPy array, a
            /// `quantrs.cuda.DeviceArray`).
            fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
                let device = crate::python::gpu::parse_device(device)?;
                slf.try_borrow_mut()?.backend.move_to(slf.py(), device)?;
                Ok(slf.clone())
            }

            fn __repr__(&self) -> String {
                repr($name, self.backend.config(), &self.backend.device().name())
            }

            /// The configuration and state as checkpoint bytes (a host copy
            /// of a device state: an unpickled optimizer is on the host).
            fn __getstate__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
                let bytes = on_backend!(&self.backend,
                    i => checkpoint::to_bytes(&i.core)?,
                    c => c.to_bytes(py)?);
                Ok(PyBytes::new(py, &bytes))
            }

            /// Replace configuration and state with `__getstate__` bytes
            /// (validated first), on this optimizer's device.
            fn __setstate__(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
                let f = crate::python::scalars::with_bytes(state, "state", crate::st::from_bytes)??;
                let t: checkpoint::Tensors = f.tensors.into_iter().collect();
                let (config, st) = checkpoint::parse(t, $name)?;
                let mut core = Adam4bitCore::new(config, $decoupled)?;
                core.restore(config, st);
                let _ = py;
                on_backend!(&mut self.backend, i => {
                    *i = Inner::of(core);
                    Ok(())
                }, c => c.load_core(py, &core))
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
