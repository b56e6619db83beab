//! The CUDA backend of `quantrs.QatOptimizer` (the pyclass in
//! `python/qat/optimizer.rs` holds it after `.to("cuda")`; moves go through
//! the CPU optimizer's bytes). Masters and gradients are CUDA arrays
//! (`DeviceArray`, or any CUDA DLPack producer) of the optimizer's dtype,
//! C-contiguous, on its device; the master is updated in place. The
//! configuration, step count and seed stay on the host inside the engine.

use pyo3::prelude::*;

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{cuda_ordinal, device_input, is_cuda_array};
use crate::error::QuantError;
use crate::gpu::memory::DeviceBuffer;
use crate::gpu::qat::DevMaster;
use crate::gpu::qat_engine::DeviceQat;
use crate::python::errors::invalid;
use crate::qat::serde::dtype_tag;
use crate::qat::{QatConfig, QatOptimizer, QuantParams, RoundingMode};

enum Engine {
    F32(DeviceQat<f32>),
    F64(DeviceQat<f64>),
}

/// Apply `f` to the engine whatever its master dtype.
macro_rules! each {
    ($inner:expr, $e:ident => $body:expr) => {
        match $inner {
            Engine::F32($e) => $body,
            Engine::F64($e) => $body,
        }
    };
}

/// `QatOptimizer` with its moments and view on a CUDA device.
pub(crate) struct CudaQat {
    inner: Engine,
    shape: Vec<usize>,
}

/// A CPU optimizer from its bytes, checked against `shape`.
fn cpu_from<T: DevMaster>(bytes: &[u8], shape: &[usize]) -> PyResult<QatOptimizer<T>> {
    let o = QatOptimizer::<T>::from_bytes(bytes)?;
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if count != Some(o.len()) {
        return Err(QuantError::ser(format!(
            "shape {shape:?} does not hold the state's {} elements",
            o.len()
        ))
        .into());
    }
    Ok(o)
}

impl CudaQat {
    fn dtype(&self) -> DType {
        match self.inner {
            Engine::F32(_) => DType::F32,
            Engine::F64(_) => DType::F64,
        }
    }

    pub(crate) fn dtype_name(&self) -> &'static str {
        self.dtype().name()
    }

    pub(crate) fn ordinal(&self) -> usize {
        each!(&self.inner, e => e.gpu().ordinal)
    }

    /// A CUDA array of this optimizer's dtype and shape on its device.
    fn operand<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        arg: &str,
    ) -> PyResult<super::input::DevInput<'py>> {
        if !is_cuda_array(obj)? {
            return Err(QuantError::arg(format!(
                "{arg} is on the host but the optimizer is on cuda:{}: pass a CUDA array \
                 (quantrs.cuda.DeviceArray, a torch.cuda tensor, a CuPy array) or move the \
                 optimizer with .to('cpu')",
                self.ordinal()
            ))
            .into());
        }
        let on = cuda_ordinal(obj)?;
        if on != self.ordinal() {
            return Err(QuantError::arg(format!(
                "{arg} is on cuda:{on} but the optimizer is on cuda:{}",
                self.ordinal()
            ))
            .into());
        }
        let g = each!(&self.inner, e => e.gpu().clone());
        let d = device_input(&g, obj, arg, self.dtype(), "the optimizer")?;
        if d.shape != self.shape {
            return Err(QuantError::dims(
                arg,
                format!("{:?}", self.shape),
                format!("{:?}", d.shape),
            )
            .into());
        }
        Ok(d)
    }

    fn array(&self, buf: std::sync::Arc<DeviceBuffer>) -> DeviceArray {
        DeviceArray {
            buf,
            shape: self.shape.clone(),
            dtype: self.dtype(),
        }
    }

    /// The optimizer whose state is `state` (`QatOptimizer.to_bytes()`) for
    /// a master of `shape`, on CUDA device `device`.
    pub(crate) fn new(
        py: Python<'_>,
        state: &[u8],
        shape: Vec<usize>,
        device: usize,
    ) -> PyResult<Self> {
        let g = gpu(py, device)?;
        let inner = match dtype_tag(state)? {
            2 => {
                let o = cpu_from::<f64>(state, &shape)?;
                Engine::F64(py.detach(|| DeviceQat::from_cpu(&g, &o))?)
            }
            _ => {
                let o = cpu_from::<f32>(state, &shape)?;
                Engine::F32(py.detach(|| DeviceQat::from_cpu(&g, &o))?)
            }
        };
        Ok(CudaQat { inner, shape })
    }

    /// One AdamW step on `master` in place, then a new view; `seed`
    /// overrides the stream seed for this step. Transactional: on error
    /// nothing changes.
    pub(crate) fn step(
        &mut self,
        py: Python<'_>,
        master: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        seed: Option<u64>,
    ) -> PyResult<()> {
        let mut w = self.operand(master, "master")?;
        let g = self.operand(grad, "grad")?;
        let bytes = (self.shape.iter().product::<usize>() * self.dtype().size()) as u64;
        if w.ptr < g.ptr + bytes && g.ptr < w.ptr + bytes {
            return Err(invalid(
                "grad",
                "overlaps the master array (it is updated in place)",
            ));
        }
        let inner = &mut self.inner;
        let res = match inner {
            Engine::F32(e) => {
                let (mut wv, gv) = (w.view_mut::<f32>()?, g.view::<f32>()?);
                py.detach(|| {
                    e.step(&mut wv, &gv, seed)
                        .and_then(|_| e.gpu().synchronize())
                })
            }
            Engine::F64(e) => {
                let (mut wv, gv) = (w.view_mut::<f64>()?, g.view::<f64>()?);
                py.detach(|| {
                    e.step(&mut wv, &gv, seed)
                        .and_then(|_| e.gpu().synchronize())
                })
            }
        };
        Ok(res?)
    }

    /// The fake-quantized view: a `DeviceArray` over the optimizer's own
    /// buffer (every step rewrites it in place).
    pub(crate) fn quantized_weights(&self) -> DeviceArray {
        self.array(each!(&self.inner, e => e.view()))
    }

    /// Device copies of the AdamW moments `(m, v)`.
    pub(crate) fn moments(&self, py: Python<'_>) -> PyResult<(DeviceArray, DeviceArray)> {
        let inner = &self.inner;
        let (m, v) = py.detach(
            || each!(inner, e => e.moments().and_then(|mv| e.gpu().synchronize().map(|_| mv))),
        )?;
        Ok((self.array(m.into()), self.array(v.into())))
    }

    pub(crate) fn quant_params(&self) -> Option<QuantParams> {
        each!(&self.inner, e => e.quant_params())
    }

    pub(crate) fn step_count(&self) -> u64 {
        each!(&self.inner, e => e.scalars().step)
    }

    pub(crate) fn config(&self) -> QatConfig {
        each!(&self.inner, e => e.scalars().config)
    }

    pub(crate) fn seed(&self) -> u64 {
        each!(&self.inner, e => e.scalars().seed)
    }

    /// The state as bytes: exactly `QatOptimizer.to_bytes()` of the CPU
    /// optimizer holding this state.
    pub(crate) fn to_bytes(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let inner = &self.inner;
        Ok(py.detach(|| each!(inner, e => e.to_cpu().map(|o| o.to_bytes())))?)
    }

    /// Replace the whole state by `state` (same dtype and length; checked
    /// on the host first, unchanged on error).
    pub(crate) fn load_bytes(&mut self, py: Python<'_>, state: &[u8]) -> PyResult<()> {
        let shape = self.shape.clone();
        match &mut self.inner {
            Engine::F32(e) => {
                let o = cpu_from::<f32>(state, &shape)?;
                py.detach(|| e.load(&o).and_then(|_| e.gpu().synchronize()))?;
            }
            Engine::F64(e) => {
                let o = cpu_from::<f64>(state, &shape)?;
                py.detach(|| e.load(&o).and_then(|_| e.gpu().synchronize()))?;
            }
        }
        Ok(())
    }

    /// Device bytes held: moments, view and the step's scratch.
    pub(crate) fn memory_usage(&self) -> usize {
        each!(&self.inner, e => e.device_bytes())
    }

    /// The AdamW hyper-parameters of `change` applied to the current
    /// configuration (validated first; all or none change).
    pub(crate) fn reconfigure(&mut self, change: impl FnOnce(&mut QatConfig)) -> crate::Result<()> {
        let mut c = self.config();
        change(&mut c);
        each!(&mut self.inner, e => e.set_hyper(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay))
    }

    pub(crate) fn set_rounding(&mut self, r: RoundingMode) {
        each!(&mut self.inner, e => e.set_rounding(r));
    }

    pub(crate) fn len(&self) -> usize {
        each!(&self.inner, e => e.len())
    }

    pub(crate) fn set_seed(&mut self, seed: u64) {
        each!(&mut self.inner, e => e.set_seed(seed));
    }
}
