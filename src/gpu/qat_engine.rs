//! `QatOptimizer` with its state on a device (docs/gpu.md): the moments and
//! the fake-quantized view in device memory, the scalar state (config,
//! seed, step, integer parameters) on the host, each step run by the QAT
//! kernels (`qat.rs`). Built from a CPU `QatOptimizer` and turned back into
//! one, so the byte format is exactly the CPU's.
//!
//! Transactional like the CPU: a step that fails (non-finite gradient or
//! master, an overflowing update, a degenerate calibration) has written
//! nothing but the dry pass's scratch. A step reads the dry pass's triples
//! back and queues the commit pass: reading the master back (or
//! `Gpu::synchronize`) waits for it.

use std::sync::Arc;

use super::context::Gpu;
use super::memory::{check_view, DeviceBuffer, DeviceSlice, DeviceSliceMut};
use super::qat::{self, DevMaster, QatBufs, QatScalars, MAX_DRY_BLOCKS};
use super::qat_launch::QatDevice;
use crate::error::{QuantError, Result};
use crate::qat::{QatConfig, QatGrid, QatOptimizer, QuantParams, RoundingMode};

/// `QatOptimizer` (float32 or float64 master) with its AdamW moments and
/// fake-quantized view on one device; the master stays the caller's. Each
/// step is bit-identical to the CPU optimizer's.
pub struct DeviceQat<T> {
    gpu: Arc<Gpu>,
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

impl<T> std::fmt::Debug for DeviceQat<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceQat(cuda:{}, {} elements)", self.gpu.ordinal, self.n)
    }
}

/// The device step fake-quantizes per tensor; the deploy grid (the serving
/// formats' quantizers) runs on the CPU.
fn per_tensor_only<T: DevMaster>(o: &QatOptimizer<T>) -> Result<()> {
    if o.grid() != QatGrid::PerTensor {
        return Err(QuantError::UnsupportedOperation(
            "QatOptimizer: the deploy grid runs on the CPU (the device step fake-quantizes \
             per tensor)"
                .into(),
        ));
    }
    Ok(())
}

impl<T: DevMaster> DeviceQat<T> {
    /// The CPU optimizer `o` (configuration and state) copied to `gpu`.
    pub fn from_cpu(gpu: &Arc<Gpu>, o: &QatOptimizer<T>) -> Result<DeviceQat<T>> {
        per_tensor_only(o)?;
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
    pub fn to_cpu(&self) -> Result<QatOptimizer<T>> {
        let s = &self.s;
        QatOptimizer::from_parts(
            s.config,
            s.seed,
            s.step,
            self.m.to_host()?,
            self.v.to_host()?,
            self.q.to_host()?,
            s.params,
        )
    }

    /// Replace the whole state by `o`'s (same length; checked first, so
    /// on error nothing changes). The view buffer is written in place.
    pub fn load(&mut self, o: &QatOptimizer<T>) -> Result<()> {
        if o.len() != self.n {
            return Err(QuantError::dims("state", self.n, o.len()));
        }
        per_tensor_only(o)?;
        let (m, v) = o.moments();
        let fresh_m = DeviceBuffer::from_host(&self.gpu, m)?;
        let fresh_v = DeviceBuffer::from_host(&self.gpu, v)?;
        let q = DeviceBuffer::from_host(&self.gpu, o.quantized_slice())?;
        copy(&self.q, &q)?;
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

    /// One AdamW step of `master` (updated in place) with `grad` (both
    /// `len()` elements on this device), then a new view; `seed` overrides
    /// the stream seed for this step. On error nothing changes.
    pub fn step(
        &mut self,
        master: &mut DeviceSliceMut<'_, T>,
        grad: &DeviceSlice<'_, T>,
        seed: Option<u64>,
    ) -> Result<()> {
        check_view(&self.gpu, "master", master.gpu(), master.len(), self.n)?;
        check_view(&self.gpu, "grad", grad.gpu(), grad.len(), self.n)?;
        let (w, g) = (master.ptr(), grad.ptr());
        let bufs = QatBufs {
            n: self.n,
            m: self.m.ptr(),
            v: self.v.ptr(),
            q: self.q.ptr(),
            partials: self.partials.ptr(),
        };
        // SAFETY: m, v, q hold `n` elements of T and `partials`
        // 3 * MAX_DRY_BLOCKS f64 (allocated so, private); master and grad
        // are checked views of `n` elements on this device, the master
        // borrowed mutably so it overlaps nothing else.
        unsafe { qat::step::<T, _>(&QatDevice(&self.gpu), &mut self.s, &bufs, w, g, seed) }
    }

    /// The device holding the state.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Elements of the master.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the master has no element.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Configuration, seed, step count and integer parameters.
    pub fn scalars(&self) -> &QatScalars {
        &self.s
    }

    /// The quantization parameters of the current view (integer targets).
    pub fn quant_params(&self) -> Option<QuantParams> {
        self.s.params
    }

    /// The view's buffer (shared, never replaced: every step rewrites it).
    pub fn view(&self) -> Arc<DeviceBuffer> {
        self.q.clone()
    }

    /// Device copies of `(m, v)`.
    pub fn moments(&self) -> Result<(DeviceBuffer, DeviceBuffer)> {
        let bytes = self.n * T::BYTES;
        let mut m = DeviceBuffer::alloc(&self.gpu, bytes)?;
        let mut v = DeviceBuffer::alloc(&self.gpu, bytes)?;
        m.view_mut::<u8>().copy_from(&self.m.view())?;
        v.view_mut::<u8>().copy_from(&self.v.view())?;
        Ok((m, v))
    }

    /// Device bytes held: moments, view and the dry pass's scratch.
    pub fn device_bytes(&self) -> usize {
        self.m.bytes() + self.v.bytes() + self.q.bytes() + self.partials.bytes()
    }

    /// Set the five AdamW hyper-parameters (validated first; all or none).
    pub fn set_hyper(&mut self, lr: f64, b1: f64, b2: f64, eps: f64, wd: f64) -> Result<()> {
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

    /// Set the rounding of the view.
    pub fn set_rounding(&mut self, r: RoundingMode) {
        self.s.config.rounding = r;
    }

    /// Set the stream seed of stochastic rounding.
    pub fn set_seed(&mut self, seed: u64) {
        self.s.seed = seed;
    }
}

/// Queue a copy of all of `src` into the shared view buffer `dst` (same
/// size), written in place so that handed-out views stay current.
fn copy(dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<()> {
    // SAFETY: `dst` is a live buffer of `dst.bytes()` bytes (the length
    // `copy_from` checks against `src`), written only by this optimizer's
    // calls, which `&mut self` serialises; no `DeviceSliceMut` of it exists
    // (the optimizer hands out only the shared buffer).
    let mut d = unsafe { DeviceSliceMut::<u8>::from_raw(dst.gpu(), dst.ptr(), dst.bytes()) };
    d.copy_from(&src.view())
}
