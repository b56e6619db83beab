//! `AdamW4bit` / `Adam4bit` with the state on a device (docs/gpu.md,
//! docs/rust.md): the
//! same keys, validation, gradient accumulation and checkpoints as the CPU
//! engine (`optim::Adam4bitCore`, which this wraps for the configuration,
//! the step count and the checkpoint format), the codes and scales in
//! device memory, and each step run by the fused kernel (`adam.rs`).
//!
//! Transactional like the CPU: every check (shapes, finiteness, read on the
//! device) runs before anything changes; a failed check leaves weights,
//! state, step count and accumulators as they were. A step is queued, not
//! waited for: reading the weight back (or `Gpu::synchronize`) waits.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::adam::{self, StepPlan};
use super::adam_launch::{accum_add, accum_mean, check_finite, DeviceExec};
use super::adam_state::DevParam;
use super::context::Gpu;
use super::memory::{check_view, DeviceBuffer, DeviceSlice, DeviceSliceMut};
use crate::error::{QuantError, Result};
use crate::optim::{
    accumulated, accumulated_mismatch, accumulation_divisor, check_accumulating, checkpoint, codecs_for, Adam4bitConfig, Adam4bitCore, OptimizerState, ParamState,
    StateMemoryStats,
};

/// A gradient summed on the device by `accumulate_grad`.
struct Accumulated {
    shape: Vec<usize>,
    sum: DeviceBuffer,
}

/// A parameter on a device (the device twin of `optim::ParamMut`).
#[derive(Debug)]
pub struct DeviceParam<'a> {
    /// The state key's name (`None`: keyed by device address and length).
    pub name: Option<&'a str>,
    /// The parameter's shape.
    pub shape: &'a [usize],
    /// The values (float32), updated in place.
    pub data: DeviceSliceMut<'a, f32>,
}

/// `AdamW4bit` (decoupled weight decay) or `Adam4bit` (L2) with its state
/// (codes, block scales, group pairs, rank-1 statistics) on one device:
/// each step is bit-identical to the CPU optimizer's, and the checkpoint
/// bytes are the CPU's.
pub struct DeviceAdam {
    gpu: Arc<Gpu>,
    /// Configuration, step count and kind; its own state stays empty (the
    /// state is `params`).
    core: Adam4bitCore,
    tables: DeviceBuffer,
    params: BTreeMap<String, DevParam>,
    accum: BTreeMap<String, Accumulated>,
    /// Unnamed parameters: (device address, length) -> registration index.
    bound: HashMap<(u64, usize), usize>,
}

impl std::fmt::Debug for DeviceAdam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceAdam({}, cuda:{}, {} parameters)",
            if self.decoupled() { "AdamW4bit" } else { "Adam4bit" },
            self.gpu.ordinal,
            self.params.len()
        )
    }
}

impl DeviceAdam {
    /// A fresh optimizer on `gpu`: `decoupled` for AdamW4bit, else Adam4bit.
    pub fn new(gpu: &Arc<Gpu>, config: Adam4bitConfig, decoupled: bool) -> Result<DeviceAdam> {
        DeviceAdam::from_core(gpu, &Adam4bitCore::new(config, decoupled)?)
    }

    /// A copy of the CPU `AdamW4bit` (configuration and state) on `gpu`.
    pub fn from_adamw(gpu: &Arc<Gpu>, o: &crate::optim::AdamW4bit) -> Result<DeviceAdam> {
        DeviceAdam::from_core(gpu, &o.core)
    }

    /// A copy of the CPU `Adam4bit` (configuration and state) on `gpu`.
    pub fn from_adam(gpu: &Arc<Gpu>, o: &crate::optim::Adam4bit) -> Result<DeviceAdam> {
        DeviceAdam::from_core(gpu, &o.core)
    }

    /// The optimizer of checkpoint `bytes` (the CPU optimizer's format) on
    /// `gpu`: `decoupled` for AdamW4bit.
    pub fn from_bytes(gpu: &Arc<Gpu>, bytes: &[u8], decoupled: bool) -> Result<DeviceAdam> {
        let mut core = Adam4bitCore::new(Adam4bitConfig::default(), decoupled)?;
        checkpoint::from_bytes(&mut core, bytes)?;
        DeviceAdam::from_core(gpu, &core)
    }

    /// The CPU optimizer `core` (configuration and state) moved to `gpu`.
    pub(crate) fn from_core(gpu: &Arc<Gpu>, core: &Adam4bitCore) -> Result<DeviceAdam> {
        // A CPU optimizer built by the infallible constructors may hold an
        // invalid config; it is reported here, before anything is uploaded.
        core.check_config()?;
        let tables = DeviceBuffer::from_host(gpu, &adam::tables(&codecs_for(core.config())))?;
        let mut params = BTreeMap::new();
        for (k, st) in &core.state().params {
            params.insert(k.clone(), DevParam::upload(gpu, st)?);
        }
        let mut empty = core.clone();
        empty.restore(
            *core.config(),
            OptimizerState {
                step: core.state().step,
                params: BTreeMap::new(),
            },
        );
        Ok(DeviceAdam {
            gpu: gpu.clone(),
            core: empty,
            tables,
            params,
            accum: BTreeMap::new(),
            bound: HashMap::new(),
        })
    }

    /// A CPU optimizer with this configuration and a host copy of the state.
    pub(crate) fn to_core(&self) -> Result<Adam4bitCore> {
        let mut params = BTreeMap::new();
        for (k, p) in &self.params {
            params.insert(k.clone(), p.download()?);
        }
        let mut core = self.core.clone();
        core.restore(
            *self.core.config(),
            OptimizerState {
                step: self.core.state().step,
                params,
            },
        );
        Ok(core)
    }

    /// The device holding the state.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A host copy of the state (step count and every parameter's codes
    /// and scales), equal to the CPU optimizer's after the same steps.
    pub fn state(&self) -> Result<OptimizerState> {
        Ok(self.to_core()?.state().clone())
    }

    /// Checkpoint bytes, exactly those of the CPU optimizer with this state.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        checkpoint::to_bytes(&self.to_core()?)
    }

    /// Replace configuration and state from checkpoint bytes (validated
    /// first, on the host; unchanged on error).
    pub fn load_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        let mut core = self.core.clone();
        checkpoint::from_bytes(&mut core, bytes)?;
        *self = DeviceAdam::from_core(&self.gpu, &core)?;
        Ok(())
    }

    fn key_of(&self, name: Option<&str>, addr: u64, len: usize) -> String {
        match name {
            Some(n) => format!("n:{n}"),
            None => match self.bound.get(&(addr, len)) {
                Some(i) => format!("p:{i}"),
                None => format!("p:{}", self.bound.len()),
            },
        }
    }

    fn bind(&mut self, name: Option<&str>, addr: u64, len: usize) {
        if name.is_none() && !self.bound.contains_key(&(addr, len)) {
            let i = self.bound.len();
            self.bound.insert((addr, len), i);
        }
    }

    /// CPU twin: `Adam4bitCore::check` (device, lengths, shape against the
    /// state, finite gradient, finite weight when L2 decay brings it into
    /// the moments).
    fn check(&self, key: &str, p: &DeviceParam<'_>, grad: &DeviceSlice<'_, f32>) -> Result<usize> {
        let n: usize = p.shape.iter().product();
        check_view(&self.gpu, "param", p.data.gpu(), p.data.len(), n)?;
        check_view(&self.gpu, "grad", grad.gpu(), grad.len(), n)?;
        if n == 0 {
            return Err(QuantError::arg(format!(
                "param: expected a non-empty array, got shape {:?}",
                p.shape
            )));
        }
        if let Some(st) = self.params.get(key) {
            if st.shape != p.shape {
                return Err(QuantError::dims(
                    format!("param shape (state {key:?})"),
                    format!("{:?}", st.shape),
                    format!("{:?}", p.shape),
                ));
            }
        }
        check_finite("grad", grad)?;
        let o = &self.core.config().optimizer;
        if !self.core.decoupled() && o.weight_decay > 0.0 {
            check_finite("param", &p.data.as_slice())?;
        }
        Ok(n)
    }

    /// One fused step of one parameter (checked: `n` elements of this
    /// device in both views).
    fn apply(
        &mut self,
        key: String,
        shape: &[usize],
        w: &mut DeviceSliceMut<'_, f32>,
        g: &DeviceSlice<'_, f32>,
    ) -> Result<()> {
        let q = self.core.config().quantization;
        let fresh = match self.params.remove(&key) {
            Some(p) => p,
            None => DevParam::upload(&self.gpu, &ParamState::new(shape, &q))?,
        };
        let t = self.core.state().step.saturating_add(1);
        let plan = StepPlan::new(
            self.core.config(),
            self.core.decoupled(),
            t,
            self.tables.ptr(),
        );
        let a = plan.args(shape, fresh.rank1(), &fresh.addrs(), w.ptr(), g.ptr());
        // SAFETY: `a` is the plan's argument block for `shape` over the
        // state `fresh` (device buffers of that shape and layout, owned
        // here), the code-book tables (owned), and `w` / `g`: views of
        // `shape`'s element count on this device (checked by the callers),
        // `w` borrowed mutably so it overlaps nothing else.
        let r = unsafe { adam::step(&DeviceExec(&self.gpu), &a, shape) };
        // A failure inside the step (a driver error) may have changed the
        // state partly: the parameter's state is dropped then, not kept half new.
        if r.is_ok() {
            self.params.insert(key, fresh);
        }
        r
    }

    /// One step of `param` (updated in place) with `grad`: validated first
    /// (nothing changes on error), then queued.
    pub fn update(&mut self, mut param: DeviceParam<'_>, grad: &DeviceSlice<'_, f32>) -> Result<()> {
        let n: usize = param.shape.iter().product();
        let addr = param.data.ptr();
        let key = self.key_of(param.name, addr, n);
        self.check(&key, &param, grad)?;
        self.bind(param.name, addr, n);
        self.apply(key, param.shape, &mut param.data, grad)
    }

    /// Add `grad` to the parameter's sum on the device (validated first);
    /// returns the parameter's state key.
    pub fn accumulate_grad(
        &mut self,
        param: &DeviceParam<'_>,
        grad: &DeviceSlice<'_, f32>,
    ) -> Result<String> {
        let p = param;
        let n: usize = p.shape.iter().product();
        let addr = p.data.ptr();
        let key = self.key_of(p.name, addr, n);
        self.check(&key, p, grad)?;
        check_accumulating(&key, self.accum.get(&key).map(|a| &a.shape[..]), p.shape)?;
        match self.accum.get_mut(&key) {
            Some(a) => accum_add(&mut a.sum.view_mut(), grad)?,
            None => {
                let mut sum = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
                sum.view_mut().copy_from(grad)?;
                self.accum.insert(
                    key.clone(),
                    Accumulated {
                        shape: p.shape.to_vec(),
                        sum,
                    },
                );
            }
        }
        self.bind(p.name, addr, n);
        Ok(key)
    }

    /// Keys with accumulated gradients, in order.
    pub fn accumulated_keys(&self) -> Vec<String> {
        self.accum.keys().cloned().collect()
    }

    /// Step every accumulated parameter with its mean gradient (sum /
    /// `steps`, in f32 as on the CPU); `params` holds one (key, parameter)
    /// per accumulated key. Everything is validated first.
    pub fn apply_accumulated_grads(
        &mut self,
        steps: usize,
        params: &mut [(String, DeviceParam<'_>)],
    ) -> Result<()> {
        let d = accumulation_divisor(steps, self.accum.len(), params.len())?;
        let mut means = Vec::with_capacity(params.len());
        for (key, p) in params.iter() {
            let a = accumulated(&self.accum, key)?;
            if a.shape != p.shape {
                return Err(accumulated_mismatch(key, &a.shape, p.shape));
            }
            let n: usize = p.shape.iter().product();
            check_view(&self.gpu, "param", p.data.gpu(), p.data.len(), n)?;
            let mut mean = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
            accum_mean(&a.sum.view(), &mut mean.view_mut(), d)?;
            check_finite("accumulated grad", &mean.view())?;
            means.push(mean);
        }
        for ((key, p), mean) in params.iter_mut().zip(&means) {
            self.apply(key.clone(), p.shape, &mut p.data, &mean.view())?;
        }
        self.accum.clear();
        Ok(())
    }

    /// Drop the accumulated gradients.
    pub fn zero_grad(&mut self) {
        self.accum.clear();
    }

    /// Advance the step count (after every parameter's `update`).
    pub fn step(&mut self) {
        self.core.step();
    }

    /// Steps taken.
    pub fn step_count(&self) -> u64 {
        self.core.state().step
    }

    /// The learning rate.
    pub fn get_lr(&self) -> f32 {
        self.core.get_lr()
    }

    /// Set the learning rate (validated as on the CPU).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        self.core.set_lr(lr)
    }

    /// `true` for AdamW4bit, `false` for Adam4bit.
    pub fn decoupled(&self) -> bool {
        self.core.decoupled()
    }

    /// The configuration (kept on the host: reading it copies no state).
    pub fn config(&self) -> &Adam4bitConfig {
        self.core.config()
    }

    /// Replace the hyper-parameters (validated first); the state is kept.
    pub fn set_optimizer_config(
        &mut self,
        c: crate::optim::Adam4bitOptimizerConfig,
    ) -> Result<()> {
        self.core.set_optimizer_config(c)
    }

    /// Elements and device bytes of the state.
    pub fn memory_usage(&self) -> StateMemoryStats {
        let n = self.num_parameters();
        StateMemoryStats {
            momentum_elements: n,
            variance_elements: n,
            third_moment_elements: 0,
            total_bytes: self.params.values().map(DevParam::bytes).sum(),
            num_parameters: n,
        }
    }

    /// Elements with state.
    pub fn num_parameters(&self) -> usize {
        self.params.values().map(DevParam::numel).sum()
    }

    /// Drop the state, the step count and the accumulated gradients.
    pub fn reset_state(&mut self) {
        self.core.reset_state();
        self.params.clear();
        self.accum.clear();
        self.bound.clear();
    }
}
