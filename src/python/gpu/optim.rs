//! `quantrs._core._CudaAdam`: the device engine behind
//! `quantrs.cuda.AdamW4bit` / `Adam4bit` (python/quantrs/cuda.py, which
//! adds the CPU optimizers' state-dict and file methods through
//! checkpoint bytes). Parameters and gradients are CUDA arrays
//! (`DeviceArray`, or any CUDA DLPack producer: a torch.cuda tensor, a CuPy
//! array), float32, C-contiguous, on the optimizer's device; the parameter
//! is updated in place.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::array::DType;
use super::device::gpu;
use super::input::{cuda_ordinal, device_input, is_cuda_array, DevInput};
use crate::error::QuantError;
use crate::gpu::adam_engine::{DeviceAdam, DeviceParam};
use crate::gpu::memory::DeviceSlice;
use crate::optim::{checkpoint, Adam4bitConfig, Adam4bitCore};
use crate::python::errors::invalid;
use crate::python::scalars::{str_arg, with_bytes};
use crate::python::sizes::int_in;

/// The `kind` argument: the optimizer class's name.
fn kind_arg(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    str_arg(obj, "kind")
}

/// The `device` argument: a CUDA ordinal (CUDA numbers devices with a C int).
fn device_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    int_in(obj, "device", 0, i32::MAX.into()).map(|v| v as usize)
}

/// The 4-bit Adam / AdamW engine with its state on one CUDA device.
#[pyclass(name = "_CudaAdam", module = "quantrs.cuda")]
pub struct CudaAdam {
    inner: DeviceAdam,
    /// Key -> the parameter `apply_accumulated_grads` will update.
    accum_params: HashMap<String, Py<PyAny>>,
}

impl CudaAdam {
    /// Validate `(param, grad)`, then run `f` on the engine with the GIL
    /// released, and wait for its kernels (the caller's tensors are read
    /// by other streams once this returns).
    fn with_pair<R: Send>(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        name: Option<&str>,
        f: impl FnOnce(&mut DeviceAdam, DeviceParam<'_>, &DeviceSlice<'_, f32>) -> crate::Result<R>
            + Send,
    ) -> PyResult<R> {
        let (mut w, g) = self.pair(param, grad)?;
        let shape = w.shape.clone();
        let gv = g.view::<f32>()?;
        let data = w.view_mut::<f32>()?;
        let inner = &mut self.inner;
        let r = py.detach(|| {
            let p = DeviceParam {
                name,
                shape: &shape,
                data,
            };
            let r = f(inner, p, &gv)?;
            inner.gpu().synchronize()?;
            Ok::<_, crate::QuantError>(r)
        })?;
        Ok(r)
    }

    fn where_(&self) -> String {
        format!("cuda:{}", self.inner.gpu().ordinal)
    }

    /// A CUDA float32 array on this device, or an error naming both devices.
    fn device_array<'py>(&self, obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<DevInput<'py>> {
        if !is_cuda_array(obj)? {
            return Err(QuantError::arg(format!(
                "{arg} is on the host but the optimizer is on {}: pass a CUDA array \
                 (quantrs.cuda.DeviceArray, a torch.cuda tensor, a CuPy array)",
                self.where_()
            ))
            .into());
        }
        let on = cuda_ordinal(obj)?;
        if on != self.inner.gpu().ordinal {
            return Err(QuantError::arg(format!(
                "{arg} is on cuda:{on} but the optimizer is on {}",
                self.where_()
            ))
            .into());
        }
        device_input(self.inner.gpu(), obj, arg, DType::F32, "the optimizer")
    }

    fn pair<'py>(
        &self,
        param: &Bound<'py, PyAny>,
        grad: &Bound<'py, PyAny>,
    ) -> PyResult<(DevInput<'py>, DevInput<'py>)> {
        let g = self.device_array(grad, "grad")?;
        let w = self.device_array(param, "param")?;
        if g.shape != w.shape {
            return Err(QuantError::dims(
                "grad",
                format!("{:?}", w.shape),
                format!("{:?}", g.shape),
            )
            .into());
        }
        let bytes = 4 * w.shape.iter().product::<usize>() as u64;
        if w.ptr < g.ptr + bytes && g.ptr < w.ptr + bytes {
            return Err(invalid("grad", "must not share memory with param"));
        }
        Ok((w, g))
    }
}

#[pymethods]
impl CudaAdam {
    /// The optimizer whose configuration and state are the checkpoint
    /// `state` (`AdamW4bit.__getstate__()` bytes), on CUDA device `device`.
    #[new]
    #[pyo3(signature = (state, kind, device = 0))]
    fn new(
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = kind_arg)] kind: String,
        #[pyo3(from_py_with = device_arg)] device: usize,
    ) -> PyResult<Self> {
        let state = with_bytes(state, "state", <[u8]>::to_vec)?;
        let decoupled = match kind.as_str() {
            "AdamW4bit" => true,
            "Adam4bit" => false,
            _ => {
                return Err(invalid(
                    "kind",
                    format!("expected 'AdamW4bit' or 'Adam4bit', got {kind:?}"),
                ))
            }
        };
        let g = gpu(py, device)?;
        let mut core = Adam4bitCore::new(Adam4bitConfig::default(), decoupled)?;
        checkpoint::from_bytes(&mut core, &state)?;
        let inner = py.detach(|| DeviceAdam::from_core(&g, &core))?;
        Ok(CudaAdam {
            inner,
            accum_params: HashMap::new(),
        })
    }

    /// One step of `param` (updated in place) with `grad`; `name` keys the
    /// state (default: the parameter's device address).
    #[pyo3(signature = (param, grad, *, name = None))]
    fn update(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::opt_text::name)] name: Option<String>,
    ) -> PyResult<()> {
        let name = name.as_deref();
        self.with_pair(py, param, grad, name, |inner, p, g| inner.update(p, g))
    }

    /// Add `grad` to the parameter's device accumulator.
    #[pyo3(signature = (param, grad, *, name = None))]
    fn accumulate_grad(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::opt_text::name)] name: Option<String>,
    ) -> PyResult<()> {
        let name = name.as_deref();
        let key = self.with_pair(py, param, grad, name, |inner, p, g| {
            inner.accumulate_grad(&p, g)
        })?;
        self.accum_params.insert(key, param.clone().unbind());
        Ok(())
    }

    /// Step every accumulated parameter with its mean gradient.
    fn apply_accumulated_grads(
        &mut self,
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::sizes::accumulation_steps)] accumulation_steps: usize,
    ) -> PyResult<()> {
        let mut inputs = Vec::new();
        for k in self.inner.accumulated_keys() {
            let obj = self.accum_params.get(&k).ok_or_else(|| {
                QuantError::InvalidState(format!("no parameter recorded for {k:?}"))
            })?;
            inputs.push((k, self.device_array(obj.bind(py), "param")?));
        }
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|(_, w)| w.shape.clone()).collect();
        let mut params = Vec::new();
        for ((k, w), shape) in inputs.iter_mut().zip(&shapes) {
            let data = w.view_mut::<f32>()?;
            params.push((
                k.clone(),
                DeviceParam {
                    name: None,
                    shape,
                    data,
                },
            ));
        }
        let inner = &mut self.inner;
        py.detach(|| {
            inner.apply_accumulated_grads(accumulation_steps, &mut params)?;
            inner.gpu().synchronize()
        })?;
        self.accum_params.clear();
        Ok(())
    }

    fn zero_grad(&mut self) {
        self.inner.zero_grad();
        self.accum_params.clear();
    }

    fn step(&mut self) {
        self.inner.step();
    }

    fn step_count(&self) -> u64 {
        self.inner.step_count()
    }

    fn get_lr(&self) -> f64 {
        f64::from(self.inner.get_lr())
    }

    fn set_lr(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64,
    ) -> PyResult<()> {
        if lr.is_finite() && !(lr as f32).is_finite() {
            return Err(invalid("lr", format!("{lr} does not fit in float32")));
        }
        Ok(self.inner.set_lr(lr as f32)?)
    }

    /// The configuration and a host copy of the state as checkpoint bytes
    /// (the CPU optimizer's `__getstate__` format).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &self.inner;
        let b = py.detach(|| inner.to_bytes())?;
        Ok(PyBytes::new(py, &b))
    }

    /// Replace configuration and state from checkpoint bytes (validated first).
    fn load_bytes(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = with_bytes(state, "state", <[u8]>::to_vec)?;
        let inner = &mut self.inner;
        py.detach(|| inner.load_bytes(&state))?;
        self.accum_params.clear();
        Ok(())
    }

    /// (momentum elements, variance elements, third-moment elements,
    /// device bytes of the state, parameters with state).
    fn memory_usage(&self) -> (usize, usize, usize, usize, usize) {
        let s = self.inner.memory_usage();
        (
            s.momentum_elements,
            s.variance_elements,
            s.third_moment_elements,
            s.total_bytes,
            s.num_parameters,
        )
    }

    fn num_parameters(&self) -> usize {
        self.inner.num_parameters()
    }

    fn reset_state(&mut self) {
        self.inner.reset_state();
        self.accum_params.clear();
    }

    /// "AdamW4bit" or "Adam4bit".
    #[getter]
    fn kind(&self) -> &'static str {
        if self.inner.decoupled() {
            "AdamW4bit"
        } else {
            "Adam4bit"
        }
    }

    #[getter]
    fn device(&self) -> String {
        self.where_()
    }
}
