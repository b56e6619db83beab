//! Where an optimizer's state lives: the host (`Inner`, the CPU engine) or
//! a CUDA device (`CudaAdam`, in a `gpu` build). The configuration is read
//! from either without copying state; the checkpoint-format methods
//! (state dicts, files, pickling, one parameter's state) run the CPU code on
//! a host copy of a device state and copy the result back.

use pyo3::prelude::*;

use super::state::Inner;
use crate::error::QuantError;
use crate::linear::Device;
use crate::optim::{Adam4bitConfig, Adam4bitOptimizerConfig};

#[cfg(feature = "gpu")]
use crate::python::gpu::CudaAdam;

/// The state of one optimizer object.
pub(super) enum Backend {
    Cpu(Inner),
    #[cfg(feature = "gpu")]
    Cuda(CudaAdam),
}

impl Backend {
    /// `"cpu"` or `"cuda:N"`.
    pub(super) fn device(&self) -> Device {
        on_backend!(self, _i => Device::Cpu, c => Device::Cuda(c.ordinal()))
    }

    pub(super) fn config(&self) -> &Adam4bitConfig {
        on_backend!(self, i => i.core.config(), c => c.config())
    }

    pub(super) fn get_lr(&self) -> f32 {
        on_backend!(self, i => i.core.get_lr(), c => c.get_lr())
    }

    pub(super) fn set_lr(&mut self, lr: f32) -> PyResult<()> {
        on_backend!(self, i => Ok(i.core.set_lr(lr)?), c => c.set_lr(lr))
    }

    /// Replace the hyper-parameters; the state and the quantization are kept.
    pub(super) fn set_optimizer_config(&mut self, o: Adam4bitOptimizerConfig) -> PyResult<()> {
        on_backend!(self, i => Ok(i.core.set_optimizer_config(o)?), c => c.set_optimizer_config(o))
    }

    /// Run `f` on the host state: the CPU engine itself, or a host copy of a
    /// device state that replaces it when `f` succeeds.
    pub(super) fn with_host<R>(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> PyResult<R>,
    ) -> PyResult<R> {
        let _ = py;
        on_backend!(self, i => f(i), c => {
            let mut host = Inner::of(c.to_core(py)?);
            let r = f(&mut host)?;
            c.load_core(py, &host.core)?;
            Ok(r)
        })
    }

    /// Run `f` on the host state (a host copy of a device state).
    pub(super) fn read_host<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Inner) -> PyResult<R>,
    ) -> PyResult<R> {
        let _ = py;
        on_backend!(self, i => f(i), c => f(&Inner::of(c.to_core(py)?)))
    }

    /// Move the state to `device` (nothing happens when it is there already).
    /// Refused while gradients are accumulated: they belong to parameters
    /// on the old device.
    pub(super) fn move_to(&mut self, py: Python<'_>, device: Device) -> PyResult<()> {
        if self.device() == device {
            return Ok(());
        }
        let pending =
            on_backend!(self, i => !i.core.accumulated_keys().is_empty(), c => c.has_accumulated());
        if pending {
            return Err(QuantError::InvalidState(format!(
                "the optimizer holds accumulated gradients: call apply_accumulated_grads() or \
                 zero_grad() before moving it to {}",
                device.name()
            ))
            .into());
        }
        *self = match device {
            Device::Cpu => Backend::Cpu(self.read_host(py, |i| Ok(Inner::of(i.core.clone())))?),
            #[cfg(feature = "gpu")]
            Device::Cuda(ordinal) => {
                Backend::Cuda(self.read_host(py, |i| CudaAdam::from_core(py, &i.core, ordinal))?)
            }
            #[cfg(not(feature = "gpu"))]
            Device::Cuda(_) => return Err(crate::python::gpu::without_gpu()),
        };
        Ok(())
    }
}
