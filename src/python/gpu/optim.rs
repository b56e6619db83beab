//! The CUDA backend of `quantrs.AdamW4bit` / `Adam4bit` (the pyclass in
//! `python/optim/optimizer.rs` holds it after `.to("cuda")`). Parameters and
//! gradients are CUDA arrays (`DeviceArray`, or any CUDA DLPack producer: a
//! torch.cuda tensor, a CuPy array), float32, C-contiguous, on the
//! optimizer's device; the parameter is updated in place. The configuration
//! stays on the host inside the engine, so reading it copies no state.

use std::collections::HashMap;

use pyo3::prelude::*;

use super::array::DType;
use super::device::gpu;
use super::input::{cuda_ordinal, device_input, is_cuda_array, DevInput};
use crate::error::QuantError;
use crate::gpu::adam_engine::{DeviceAdam, DeviceParam};
use crate::gpu::memory::DeviceSlice;
use crate::optim::{Adam4bitConfig, Adam4bitCore, Adam4bitOptimizerConfig, StateMemoryStats};
use crate::python::errors::invalid;

/// The 4-bit Adam / AdamW engine with its state on one CUDA device.
pub(crate) struct CudaAdam {
    inner: DeviceAdam,
    /// Key -> the parameter `apply_accumulated_grads` will update.
    accum_params: HashMap<String, Py<PyAny>>,
}

impl CudaAdam {
    /// The CPU optimizer `core` (configuration, step count, state) copied to
    /// CUDA device `ordinal`.
    pub(crate) fn from_core(py: Python<'_>, core: &Adam4bitCore, ordinal: usize) -> PyResult<Self> {
        let g = gpu(py, ordinal)?;
        let inner = py.detach(|| DeviceAdam::from_core(&g, core))?;
        Ok(CudaAdam {
            inner,
            accum_params: HashMap::new(),
        })
    }

    /// A CPU optimizer with this configuration and a host copy of the state.
    pub(crate) fn to_core(&self, py: Python<'_>) -> PyResult<Adam4bitCore> {
        let inner = &self.inner;
        Ok(py.detach(|| inner.to_core())?)
    }

    /// The configuration and a host copy of the state as checkpoint bytes.
    pub(crate) fn to_bytes(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let inner = &self.inner;
        Ok(py.detach(|| inner.to_bytes())?)
    }

    /// Replace configuration and state by `core`'s (copied to this device).
    pub(crate) fn load_core(&mut self, py: Python<'_>, core: &Adam4bitCore) -> PyResult<()> {
        *self = CudaAdam::from_core(py, core, self.ordinal())?;
        Ok(())
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.inner.gpu().ordinal
    }

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

    /// A CUDA float32 array on this device, or an error naming both devices.
    fn device_array<'py>(&self, obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<DevInput<'py>> {
        let here = self.ordinal();
        if !is_cuda_array(obj)? {
            return Err(QuantError::arg(format!(
                "{arg} is on the host but the optimizer is on cuda:{here}: pass a CUDA array \
                 (quantrs.cuda.DeviceArray, a torch.cuda tensor, a CuPy array) or move the \
                 optimizer with .to('cpu')"
            ))
            .into());
        }
        let on = cuda_ordinal(obj)?;
        if on != here {
            return Err(QuantError::arg(format!(
                "{arg} is on cuda:{on} but the optimizer is on cuda:{here}"
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

    /// One step of `param` (updated in place) with `grad`.
    pub(crate) fn update(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        name: Option<&str>,
    ) -> PyResult<()> {
        self.with_pair(py, param, grad, name, |inner, p, g| inner.update(p, g))
    }

    /// Add `grad` to the parameter's device accumulator.
    pub(crate) fn accumulate(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        name: Option<&str>,
    ) -> PyResult<()> {
        let key = self.with_pair(py, param, grad, name, |inner, p, g| {
            inner.accumulate_grad(&p, g)
        })?;
        self.accum_params.insert(key, param.clone().unbind());
        Ok(())
    }

    /// Step every accumulated parameter with its mean gradient.
    pub(crate) fn apply_accumulated(&mut self, py: Python<'_>, steps: usize) -> PyResult<()> {
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
            inner.apply_accumulated_grads(steps, &mut params)?;
            inner.gpu().synchronize()
        })?;
        self.accum_params.clear();
        Ok(())
    }

    pub(crate) fn has_accumulated(&self) -> bool {
        !self.inner.accumulated_keys().is_empty()
    }

    pub(crate) fn zero_grad(&mut self) {
        self.inner.zero_grad();
        self.accum_params.clear();
    }

    pub(crate) fn step(&mut self) {
        self.inner.step();
    }

    pub(crate) fn get_lr(&self) -> f32 {
        self.inner.get_lr()
    }

    pub(crate) fn set_lr(&mut self, lr: f32) -> PyResult<()> {
        Ok(self.inner.set_lr(lr)?)
    }

    pub(crate) fn config(&self) -> &Adam4bitConfig {
        self.inner.config()
    }

    pub(crate) fn set_optimizer_config(&mut self, c: Adam4bitOptimizerConfig) -> PyResult<()> {
        Ok(self.inner.set_optimizer_config(c)?)
    }

    /// Elements and device bytes of the state.
    pub(crate) fn memory_usage(&self) -> StateMemoryStats {
        self.inner.memory_usage()
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.inner.num_parameters()
    }

    pub(crate) fn reset_state(&mut self) {
        self.inner.reset_state();
        self.accum_params.clear();
    }
}
