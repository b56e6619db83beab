//! `QatOptimizer` with its state on a device (docs/gpu.md): the moments and
//! the fake-quantized view in device memory, the scalar state (config,
//! seed, step, integer parameters) on the host, each step run by the QAT
//! kernels (`qat.rs`). Built from a CPU `QatOptimizer` and turned back into
//! one, so the byte format is exactly the CPU's.
//!
//! Transactional like the CPU: a step that fails (non-finite gradient or
//! master, an overflowing update, a degenerate calibration) has written
//! nothing but the dry pass's scratch.

use std::sync::Arc;

use super::context::Gpu;
use super::memory::{to_host, DeviceBuffer};
use super::qat::{self, DevMaster, QatBufs, QatScalars, MAX_DRY_BLOCKS};
use super::qat_launch::QatDevice;
use crate::error::{QuantError, Result};
use crate::qat::{QatConfig, QatOptimizer, QuantParams, RoundingMode};

/// One optimizer's state on one device.
pub(crate) struct DeviceQat<T> {
    pub gpu: Arc<Gpu>,
    s: QatScalars,
    n: usize,
    m: DeviceBuffer,
    v: DeviceBuffer,
    /// Shared with the view arrays handed out; written in place, never
    /// replaced, so a view stays the optimizer's current one.
    q: Arc<DeviceBuffer>,
    partials: DeviceBuffer,
    _t: std::marker::PhantomData<T>,
}

impl<T: DevMaster> DeviceQat<T> {
    /// The CPU optimizer `o` (configuration and state) copied to `gpu`.
    pub(crate) fn from_cpu(gpu: &Arc<Gpu>, o: &QatOptimizer<T>) -> Result<DeviceQat<T>> {
        let (m, v) = o.moments();
        Ok(DeviceQat {
            gpu: gpu.clone(),
            s: QatScalars {
                config: *o.config(),
                seed: o.seed(),
                step: o.step_count(),
                params: o.quant_params().copied(),
            },
            n: o.len(),
            m: DeviceBuffer::from_host(gpu, m)?,
            v: DeviceBuffer::from_host(gpu, v)?,
            q: Arc::new(DeviceBuffer::from_host(gpu, o.quantized_slice())?),
            partials: DeviceBuffer::alloc(gpu, 24 * MAX_DRY_BLOCKS)?,
            _t: std::marker::PhantomData,
        })
    }

    /// A CPU optimizer with this configuration and a host copy of the state.
    pub(crate) fn to_cpu(&self) -> Result<QatOptimizer<T>> {
        let s = &self.s;
        QatOptimizer::from_parts(
            s.config,
            s.seed,
            s.step,
            to_host(&self.gpu, self.m.ptr(), self.n)?,
            to_host(&self.gpu, self.v.ptr(), self.n)?,
            to_host(&self.gpu, self.q.ptr(), self.n)?,
            s.params,
        )
    }

    /// Replace the whole state by `o`'s (same length; checked first, so
    /// on error nothing changes). The view buffer is written in place.
    pub(crate) fn load(&mut self, o: &QatOptimizer<T>) -> Result<()> {
        if o.len() != self.n {
            return Err(QuantError::dims("state", self.n, o.len()));
        }
        let (m, v) = o.moments();
        let fresh_m = DeviceBuffer::from_host(&self.gpu, m)?;
        let fresh_v = DeviceBuffer::from_host(&self.gpu, v)?;
        let q = DeviceBuffer::from_host(&self.gpu, o.quantized_slice())?;
        copy(&self.gpu, self.q.ptr(), q.ptr(), self.n * T::BYTES)?;
        self.m = fresh_m;
        self.v = fresh_v;
        self.s = QatScalars {
            config: *o.config(),
            seed: o.seed(),
            step: o.step_count(),
            params: o.quant_params().copied(),
        };
        Ok(())
    }

    /// One step of the master at `w` with the gradient at `g` (device
    /// addresses of `len()` elements of `T`, checked by the caller);
    /// `seed` overrides the stream seed for this step.
    pub(crate) fn step(&mut self, w: u64, g: u64, seed: Option<u64>) -> Result<()> {
        let bufs = QatBufs {
            n: self.n,
            m: self.m.ptr(),
            v: self.v.ptr(),
            q: self.q.ptr(),
            partials: self.partials.ptr(),
        };
        qat::step::<T, _>(&QatDevice(&self.gpu), &mut self.s, &bufs, w, g, seed)
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    pub(crate) fn scalars(&self) -> &QatScalars {
        &self.s
    }

    pub(crate) fn quant_params(&self) -> Option<QuantParams> {
        self.s.params
    }

    /// The view's buffer (shared, never replaced).
    pub(crate) fn view(&self) -> Arc<DeviceBuffer> {
        self.q.clone()
    }

    /// Device copies of `(m, v)`.
    pub(crate) fn moments(&self) -> Result<(DeviceBuffer, DeviceBuffer)> {
        let bytes = self.n * T::BYTES;
        let m = DeviceBuffer::alloc(&self.gpu, bytes)?;
        let v = DeviceBuffer::alloc(&self.gpu, bytes)?;
        copy(&self.gpu, m.ptr(), self.m.ptr(), bytes)?;
        copy(&self.gpu, v.ptr(), self.v.ptr(), bytes)?;
        Ok((m, v))
    }

    /// Device bytes held: moments, view and the dry pass's scratch.
    pub(crate) fn device_bytes(&self) -> usize {
        self.m.bytes() + self.v.bytes() + self.q.bytes() + self.partials.bytes()
    }

    /// Set the five AdamW hyper-parameters (validated first; all or none).
    pub(crate) fn set_hyper(&mut self, lr: f64, b1: f64, b2: f64, eps: f64, wd: f64) -> Result<()> {
        let c = QatConfig {
            lr,
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
            ..self.s.config
        };
        c.validate()?;
        self.s.config = c;
        Ok(())
    }

    pub(crate) fn set_rounding(&mut self, r: RoundingMode) {
        self.s.config.rounding = r;
    }

    pub(crate) fn set_seed(&mut self, seed: u64) {
        self.s.seed = seed;
    }
}

/// Copy `bytes` bytes between two device buffers (synchronous).
fn copy(gpu: &Gpu, dst: u64, src: u64, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    gpu.bind()?;
    // SAFETY: two distinct live device buffers of at least `bytes` bytes.
    unsafe { cudarc::driver::result::memcpy_dtod_sync(dst, src, bytes) }
        .map_err(|e| super::context::gpu_err("copying on the device", e))
}
