//! `AdamW4bit` / `Adam4bit` with the state on a device (docs/gpu.md): the
//! same keys, validation, gradient accumulation and checkpoints as the CPU
//! engine (`optim::Adam4bitCore`, which this wraps for the configuration,
//! the step count and the checkpoint format), the codes and scales in
//! device memory, and each step run by the fused kernel (`adam.rs`).
//!
//! Transactional like the CPU: every check (shapes, finiteness, read on the
//! device) runs before anything changes; a failed check leaves weights,
//! state, step count and accumulators as they were.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::adam::{self, Exec, StepPlan};
use super::adam_launch::{check_finite, elementwise, DeviceExec};
use super::adam_state::DevParam;
use super::context::Gpu;
use super::memory::DeviceBuffer;
use crate::error::{QuantError, Result};
use crate::optim::{
    checkpoint, codecs_for, Adam4bitCore, OptimizerState, ParamState, StateMemoryStats,
};

/// A gradient summed on the device by `accumulate_grad`.
struct Accumulated {
    shape: Vec<usize>,
    sum: DeviceBuffer,
}

/// A parameter of a call: its key's name (None: keyed by address), shape,
/// and device addresses of its values and gradient.
#[derive(Clone, Debug)]
pub(crate) struct DevParamRef<'a> {
    pub name: Option<&'a str>,
    pub shape: &'a [usize],
    pub w: u64,
    pub g: u64,
}

/// The optimizer with its state on one device.
pub(crate) struct DeviceAdam {
    pub gpu: Arc<Gpu>,
    /// Configuration, step count and kind; its own state stays empty (the
    /// state is `params`).
    core: Adam4bitCore,
    tables: DeviceBuffer,
    params: BTreeMap<String, DevParam>,
    accum: BTreeMap<String, Accumulated>,
    /// Unnamed parameters: (device address, length) -> registration index.
    bound: HashMap<(u64, usize), usize>,
}

impl DeviceAdam {
    /// The CPU optimizer `core` (configuration and state) moved to `gpu`.
    pub(crate) fn from_core(gpu: &Arc<Gpu>, core: &Adam4bitCore) -> Result<DeviceAdam> {
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
            params.insert(k.clone(), p.download(&self.gpu)?);
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

    /// Checkpoint bytes, exactly those of the CPU optimizer with this state.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        checkpoint::to_bytes(&self.to_core()?)
    }

    /// Replace configuration and state from checkpoint bytes (validated
    /// first, on the host; unchanged on error).
    #[allow(dead_code)] // Rust-side API; the bindings load a parsed core instead
    pub(crate) fn load_bytes(&mut self, bytes: &[u8]) -> Result<()> {
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

    /// CPU twin: `Adam4bitCore::check` (shape against the state, finite
    /// gradient, finite weight when L2 decay brings it into the moments).
    fn check(&self, key: &str, p: &DevParamRef<'_>) -> Result<usize> {
        let n: usize = p.shape.iter().product();
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
        check_finite(&self.gpu, "grad", p.g, n)?;
        let o = &self.core.config().optimizer;
        if !self.core.decoupled() && o.weight_decay > 0.0 {
            check_finite(&self.gpu, "param", p.w, n)?;
        }
        Ok(n)
    }

    /// One fused step of one parameter with the gradient at `g`.
    fn apply(&mut self, key: String, shape: &[usize], w: u64, g: u64) -> Result<()> {
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
        let a = plan.args(shape, fresh.rank1(), &fresh.addrs(), w, g);
        let r = adam::step(&DeviceExec(&self.gpu), &a, shape).and_then(|_| self.gpu.synchronize());
        // A failure inside the step (a driver error) may have changed the
        // state partly: the parameter's state is dropped then, not kept half new.
        if r.is_ok() {
            self.params.insert(key, fresh);
        }
        r
    }

    /// `update(param, grad)`: validated first, then one step.
    pub(crate) fn update(&mut self, p: DevParamRef<'_>) -> Result<()> {
        let n: usize = p.shape.iter().product();
        let key = self.key_of(p.name, p.w, n);
        self.check(&key, &p)?;
        self.bind(p.name, p.w, n);
        self.apply(key, p.shape, p.w, p.g)
    }

    /// `accumulate_grad(param, grad)`: the gradient added to the key's sum
    /// on the device; returns the key.
    pub(crate) fn accumulate(&mut self, p: DevParamRef<'_>) -> Result<String> {
        let n: usize = p.shape.iter().product();
        let key = self.key_of(p.name, p.w, n);
        self.check(&key, &p)?;
        if let Some(a) = self.accum.get(&key) {
            if a.shape != p.shape {
                return Err(QuantError::dims(
                    format!("param shape (accumulated {key:?})"),
                    format!("{:?}", a.shape),
                    format!("{:?}", p.shape),
                ));
            }
        }
        match self.accum.get(&key) {
            Some(a) => {
                elementwise(&self.gpu, "accum_add_f32", a.sum.ptr(), p.g, n, 0.0)?;
                self.gpu.synchronize()?;
            }
            None => {
                let sum = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
                DeviceExec(&self.gpu).copy(sum.ptr(), p.g, 4 * n)?;
                self.accum.insert(
                    key.clone(),
                    Accumulated {
                        shape: p.shape.to_vec(),
                        sum,
                    },
                );
            }
        }
        self.bind(p.name, p.w, n);
        Ok(key)
    }

    /// Keys with accumulated gradients, in order.
    pub(crate) fn accumulated_keys(&self) -> Vec<String> {
        self.accum.keys().cloned().collect()
    }

    /// CPU twin: `Adam4bitCore::apply_accumulated_grads`; `params` are
    /// (key, shape, weight address), one per accumulated key.
    pub(crate) fn apply_accumulated(
        &mut self,
        steps: usize,
        params: &[(String, Vec<usize>, u64)],
    ) -> Result<()> {
        if steps == 0 {
            return Err(QuantError::arg(
                "accumulation_steps: expected a value >= 1, got 0",
            ));
        }
        if params.len() != self.accum.len() {
            return Err(QuantError::InvalidState(format!(
                "apply_accumulated_grads: {} parameters accumulated, {} given",
                self.accum.len(),
                params.len()
            )));
        }
        let d = steps as f32;
        let mut means = Vec::with_capacity(params.len());
        for (key, shape, _) in params {
            let a = self.accum.get(key).ok_or_else(|| {
                QuantError::InvalidState(format!("no accumulated gradient for {key:?}"))
            })?;
            if &a.shape != shape {
                return Err(QuantError::dims(
                    format!("param {key:?}"),
                    format!("{:?}", a.shape),
                    format!("{shape:?}"),
                ));
            }
            let n: usize = shape.iter().product();
            let mean = DeviceBuffer::alloc(&self.gpu, 4 * n)?;
            elementwise(&self.gpu, "accum_mean_f32", mean.ptr(), a.sum.ptr(), n, d)?;
            check_finite(&self.gpu, "accumulated grad", mean.ptr(), n)?;
            means.push(mean);
        }
        for ((key, shape, w), mean) in params.iter().zip(&means) {
            self.apply(key.clone(), shape, *w, mean.ptr())?;
        }
        self.accum.clear();
        Ok(())
    }

    pub(crate) fn zero_grad(&mut self) {
        self.accum.clear();
    }

    pub(crate) fn step(&mut self) {
        self.core.step();
    }

    #[allow(dead_code)] // Rust-side API; the bindings read the configuration instead
    pub(crate) fn step_count(&self) -> u64 {
        self.core.state().step
    }

    pub(crate) fn get_lr(&self) -> f32 {
        self.core.get_lr()
    }

    pub(crate) fn set_lr(&mut self, lr: f32) -> Result<()> {
        self.core.set_lr(lr)
    }

    #[allow(dead_code)] // Rust-side API; the bindings read the configuration instead
    pub(crate) fn decoupled(&self) -> bool {
        self.core.decoupled()
    }

    /// The configuration (kept on the host: reading it copies no state).
    pub(crate) fn config(&self) -> &crate::optim::Adam4bitConfig {
        self.core.config()
    }

    /// Replace the hyper-parameters (validated first); the state is kept.
    pub(crate) fn set_optimizer_config(
        &mut self,
        c: crate::optim::Adam4bitOptimizerConfig,
    ) -> Result<()> {
        self.core.set_optimizer_config(c)
    }

    /// Elements and device bytes of the state.
    pub(crate) fn memory_usage(&self) -> StateMemoryStats {
        let n = self.num_parameters();
        StateMemoryStats {
            momentum_elements: n,
            variance_elements: n,
            third_moment_elements: 0,
            total_bytes: self.params.values().map(DevParam::bytes).sum(),
            num_parameters: n,
        }
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.params.values().map(DevParam::numel).sum()
    }

    pub(crate) fn reset_state(&mut self) {
        self.core.reset_state();
        self.params.clear();
        self.accum.clear();
        self.bound.clear();
    }
}
