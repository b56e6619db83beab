//! The engine shared by `Adam4bit` and `AdamW4bit` ([`Adam4bitCore`]): the
//! weight decay folded into the gradient (Adam, L2) or applied to the
//! weight (AdamW, decoupled, as PyTorch's `AdamW`); parameter keys,
//! validation, gradient accumulation and the step over every parameter.

use std::collections::{BTreeMap, HashMap};

use super::codebook::{dynamic8, Codebook16, Codebook256, DYNAMIC4, INT4, NF4};
use super::config::{check_lr, Adam4bitConfig, Adam4bitOptimizerConfig, QuantizationMethod};
use super::dispatch::Kernels;
use super::format::{Codecs, MCodec, StepConsts};
use super::state::{step_param, Clamp, OptimizerState, ParamState, RowLayout, StepCtx};
use super::traits::{ParamMut, ParamRef, StateMemoryStats};
use crate::error::{QuantError, Result};
use crate::simd::SimdLevel;

/// The constants of step `t` (1-based); shared with the device step
/// (`gpu::adam::StepPlan`), so both take the very same values.
pub(crate) fn step_consts(o: &Adam4bitOptimizerConfig, decoupled: bool, t: u64) -> StepConsts {
    StepConsts::new(
        o.learning_rate,
        o.beta1,
        o.beta2,
        o.epsilon,
        o.weight_decay,
        decoupled,
        t,
    )
}

/// The divisor of `apply_accumulated_grads` (`accumulation_steps` as f32)
/// after its count checks; shared with the device engine
/// (`gpu::adam_engine`), which reports the same errors.
pub(crate) fn accumulation_divisor(steps: usize, accumulated: usize, given: usize) -> Result<f32> {
    if steps == 0 {
        return Err(QuantError::arg(
            "accumulation_steps: expected a value >= 1, got 0",
        ));
    }
    if given != accumulated {
        return Err(QuantError::InvalidState(format!(
            "apply_accumulated_grads: {accumulated} parameters accumulated, {given} given"
        )));
    }
    Ok(steps as f32)
}

/// The gradient sum accumulated under `key`.
pub(crate) fn accumulated<'a, A>(accum: &'a BTreeMap<String, A>, key: &str) -> Result<&'a A> {
    accum
        .get(key)
        .ok_or_else(|| QuantError::InvalidState(format!("no accumulated gradient for {key:?}")))
}

/// The error of a parameter whose shape is not the accumulated one.
pub(crate) fn accumulated_mismatch(key: &str, have: &[usize], shape: &[usize]) -> QuantError {
    QuantError::dims(
        format!("param {key:?}"),
        format!("{have:?}"),
        format!("{shape:?}"),
    )
}

/// `accumulate_grad`'s check: a key already accumulated keeps its shape.
pub(crate) fn check_accumulating(key: &str, have: Option<&[usize]>, shape: &[usize]) -> Result<()> {
    match have {
        Some(a) if a != shape => Err(QuantError::dims(
            format!("param shape (accumulated {key:?})"),
            format!("{a:?}"),
            format!("{shape:?}"),
        )),
        _ => Ok(()),
    }
}

/// A gradient summed by `accumulate_grad`.
#[derive(Clone, Debug)]
struct Accumulated {
    shape: Vec<usize>,
    sum: Vec<f32>,
}

/// The shared engine of both optimizers.
#[derive(Clone, Debug)]
pub(crate) struct Adam4bitCore {
    config: Adam4bitConfig,
    decoupled: bool,
    state: OptimizerState,
    codecs: Codecs,
    accum: BTreeMap<String, Accumulated>,
    /// Unnamed parameters: (buffer address, length) -> registration index.
    bound: HashMap<(usize, usize), usize>,
    kernels: Kernels,
    /// The layout of new parameters' state (`set_row_layout`).
    rows: Option<RowLayout>,
}

pub(crate) fn codecs_for(config: &Adam4bitConfig) -> Codecs {
    let q = &config.quantization;
    let m = match q.method {
        QuantizationMethod::Nf4 => MCodec::Four(Codebook16::new(NF4)),
        QuantizationMethod::Int4 => MCodec::Four(Codebook16::new(INT4)),
        QuantizationMethod::Dynamic => MCodec::Four(Codebook16::new(DYNAMIC4)),
        QuantizationMethod::Int8 => MCodec::Eight(Box::new(Codebook256::new(dynamic8()))),
    };
    Codecs {
        m,
        v: Codebook16::new(q.variance_map.table()),
        sqrt_domain: q.variance_map.sqrt_domain(),
    }
}

fn check_finite(kernels: &Kernels, what: &str, x: &[f32]) -> Result<()> {
    use rayon::prelude::*;
    let bad = x.par_chunks(1 << 16).any(|c| !kernels.all_finite(c));
    if bad {
        let i = x.iter().position(|v| !v.is_finite()).unwrap_or(0);
        return Err(QuantError::arg(format!(
            "{what}: expected finite values, got {} at flat index {i}",
            x[i]
        )));
    }
    Ok(())
}

impl Adam4bitCore {
    pub(crate) fn new(config: Adam4bitConfig, decoupled: bool) -> Result<Self> {
        config.validate()?;
        Ok(Self::unvalidated(config, decoupled))
    }

    /// An engine that keeps `config` as given; an invalid config is
    /// reported by [`Self::check_config`], which every method that reads
    /// the hyper-parameters or the block layout calls first.
    pub(crate) fn unvalidated(config: Adam4bitConfig, decoupled: bool) -> Self {
        Adam4bitCore {
            codecs: codecs_for(&config),
            config,
            decoupled,
            state: OptimizerState::default(),
            accum: BTreeMap::new(),
            bound: HashMap::new(),
            kernels: Kernels::in_force(),
            rows: None,
        }
    }

    /// Lay out the state of parameters created or imported from now on in
    /// the row layout `rows` ([`RowLayout`]; `None`: flat). Refused, with
    /// nothing changed, with rank-1 normalization (its column maxima span
    /// every row).
    pub(crate) fn set_row_layout(&mut self, rows: Option<RowLayout>) -> Result<()> {
        if rows.is_some() && self.config.quantization.rank1_normalization {
            return Err(QuantError::arg(
                "rows: the row layout needs rank1_normalization=False (its column maxima span \
                 every row)",
            ));
        }
        if let Some(r) = rows {
            if r.first_row >= r.global_rows {
                return Err(QuantError::arg(format!(
                    "first_row: expected a value < global_rows = {}, got {}",
                    r.global_rows, r.first_row
                )));
            }
        }
        self.rows = rows;
        Ok(())
    }

    /// The row layout of new parameters' state.
    pub(crate) fn row_layout(&self) -> Option<RowLayout> {
        self.rows
    }

    /// An error unless `shape` fits the row layout (2-D, rows a multiple of
    /// the block size, inside the whole parameter's rows).
    pub(crate) fn check_row_shape(&self, shape: &[usize]) -> Result<()> {
        let Some(r) = self.rows else { return Ok(()) };
        let bs = self.config.quantization.block_size;
        if shape.len() != 2 || !shape[1].is_multiple_of(bs) {
            return Err(QuantError::arg(format!(
                "param: the row layout takes [rows, row length] with the row length a multiple \
                 of block_size = {bs}, got shape {shape:?}"
            )));
        }
        if r.first_row + shape[0] as u64 > r.global_rows {
            return Err(QuantError::arg(format!(
                "param: rows {}..{} of a parameter of {} rows",
                r.first_row,
                r.first_row + shape[0] as u64,
                r.global_rows
            )));
        }
        Ok(())
    }

    /// The validation error of the config, if it is invalid.
    pub(crate) fn check_config(&self) -> Result<()> {
        self.config.validate()
    }

    /// Use the kernels of `level` (tests compare levels); an error, and no
    /// change, for a level above the one in force.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn set_simd_level(&mut self, level: SimdLevel) -> Result<()> {
        self.kernels = Kernels::at(level)?;
        Ok(())
    }

    pub(crate) fn decoupled(&self) -> bool {
        self.decoupled
    }

    pub(crate) fn config(&self) -> &Adam4bitConfig {
        &self.config
    }

    pub(crate) fn state(&self) -> &OptimizerState {
        &self.state
    }

    /// The state key of a parameter, without registering it.
    pub(crate) fn key_of(&self, name: Option<&str>, addr: usize, len: usize) -> String {
        match name {
            Some(n) => format!("n:{n}"),
            None => match self.bound.get(&(addr, len)) {
                Some(i) => format!("p:{i}"),
                None => format!("p:{}", self.bound.len()),
            },
        }
    }

    fn bind(&mut self, name: Option<&str>, addr: usize, len: usize) {
        if name.is_none() && !self.bound.contains_key(&(addr, len)) {
            let i = self.bound.len();
            self.bound.insert((addr, len), i);
        }
    }

    /// Validate a parameter/gradient pair against the state it maps to.
    fn check(&self, key: &str, shape: &[usize], param: &[f32], grad: &[f32]) -> Result<()> {
        self.check_config()?;
        let n: usize = shape.iter().product();
        if n == 0 {
            return Err(QuantError::arg(format!(
                "param: expected a non-empty array, got shape {shape:?}"
            )));
        }
        if param.len() != n {
            return Err(QuantError::dims("param", n, param.len()));
        }
        if grad.len() != n {
            return Err(QuantError::dims("grad length", n, grad.len()));
        }
        if !self.state.params.contains_key(key) {
            self.check_row_shape(shape)?;
        }
        if let Some(st) = self.state.params.get(key) {
            if st.shape != shape {
                return Err(QuantError::dims(
                    format!("param shape (state {key:?})"),
                    format!("{:?}", st.shape),
                    format!("{shape:?}"),
                ));
            }
        }
        check_finite(&self.kernels, "grad", grad)?;
        if !self.decoupled && self.config.optimizer.weight_decay > 0.0 {
            // With L2 decay the weight enters m and v.
            check_finite(&self.kernels, "param", param)?;
        }
        Ok(())
    }

    fn ctx(&self) -> StepCtx<'_> {
        let o = &self.config.optimizer;
        let q = &self.config.quantization;
        let (lo, hi) = (q.min_scale, q.max_scale);
        let u_clamp = if self.codecs.sqrt_domain {
            Clamp { lo, hi }
        } else {
            Clamp {
                lo: lo * lo,
                hi: hi * hi,
            }
        };
        StepCtx {
            kernels: self.kernels,
            t: self.state.step + 1,
            k: step_consts(o, self.decoupled, self.state.step.saturating_add(1)),
            codecs: &self.codecs,
            block_size: q.block_size,
            m_clamp: Clamp { lo, hi },
            u_clamp,
        }
    }

    fn apply(&mut self, key: String, shape: &[usize], param: &mut [f32], grad: &[f32]) {
        let q = self.config.quantization;
        let mut st = self
            .state
            .params
            .remove(&key)
            .unwrap_or_else(|| ParamState::with_rows(shape, &q, self.rows));
        step_param(&self.ctx(), &mut st, param, grad);
        self.state.params.insert(key, st);
    }

    /// One update of `param` with `grad` (validated first; on error nothing
    /// changes).
    pub(crate) fn update(&mut self, param: ParamMut<'_>, grad: &[f32]) -> Result<()> {
        self.check_update(
            ParamRef {
                name: param.name,
                shape: param.shape,
                data: param.data,
            },
            grad,
        )?;
        self.update_checked(param, grad);
        Ok(())
    }

    /// The validation half of [`Self::update`]: the multi-tensor step
    /// (`multi.rs`) checks every parameter of a list before it changes any.
    pub(crate) fn check_update(&self, param: ParamRef<'_>, grad: &[f32]) -> Result<()> {
        let key = self.key_of(param.name, param.data.as_ptr() as usize, param.data.len());
        self.check(&key, param.shape, param.data, grad)
    }

    /// The update half of [`Self::update`], for a pair that passed
    /// [`Self::check_update`] on this engine with nothing changed since.
    pub(crate) fn update_checked(&mut self, param: ParamMut<'_>, grad: &[f32]) {
        let addr = param.data.as_ptr() as usize;
        let key = self.key_of(param.name, addr, param.data.len());
        self.bind(param.name, addr, param.data.len());
        self.apply(key, param.shape, param.data, grad);
    }

    pub(crate) fn accumulate_grad(&mut self, param: ParamRef<'_>, grad: &[f32]) -> Result<String> {
        let addr = param.data.as_ptr() as usize;
        let key = self.key_of(param.name, addr, param.data.len());
        self.check(&key, param.shape, param.data, grad)?;
        check_accumulating(
            &key,
            self.accum.get(&key).map(|a| &a.shape[..]),
            param.shape,
        )?;
        self.bind(param.name, addr, param.data.len());
        match self.accum.get_mut(&key) {
            Some(a) => a.sum.iter_mut().zip(grad).for_each(|(s, g)| *s += g),
            None => {
                self.accum.insert(
                    key.clone(),
                    Accumulated {
                        shape: param.shape.to_vec(),
                        sum: grad.to_vec(),
                    },
                );
            }
        }
        Ok(key)
    }

    /// Keys with accumulated gradients, in order.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn accumulated_keys(&self) -> Vec<String> {
        self.accum.keys().cloned().collect()
    }

    /// Average each accumulated gradient over `accumulation_steps`, update
    /// the matching parameter of `params` (one per accumulated key, matched
    /// by `name` = the key), clear the buffers. Validates everything first.
    pub(crate) fn apply_accumulated_grads(
        &mut self,
        accumulation_steps: usize,
        params: &mut [(String, ParamMut<'_>)],
    ) -> Result<()> {
        self.check_config()?;
        let d = accumulation_divisor(accumulation_steps, self.accum.len(), params.len())?;
        let mut means = Vec::with_capacity(params.len());
        for (key, p) in params.iter() {
            let a = accumulated(&self.accum, key)?;
            if a.shape != p.shape || p.data.len() != a.sum.len() {
                return Err(accumulated_mismatch(key, &a.shape, p.shape));
            }
            let mean: Vec<f32> = a.sum.iter().map(|s| s / d).collect();
            check_finite(&self.kernels, "accumulated grad", &mean)?;
            means.push(mean);
        }
        for ((key, p), mean) in params.iter_mut().zip(&means) {
            self.apply(key.clone(), p.shape, p.data, mean);
        }
        self.accum.clear();
        Ok(())
    }

    pub(crate) fn zero_grad(&mut self) {
        self.accum.clear();
    }

    /// Saturates instead of wrapping; loaded steps are at most
    /// `checkpoint::MAX_STEP` (2**53), so the limit is never reached in
    /// practice.
    pub(crate) fn step(&mut self) {
        self.state.step = self.state.step.saturating_add(1);
    }

    pub(crate) fn get_lr(&self) -> f32 {
        self.config.optimizer.learning_rate
    }

    pub(crate) fn set_lr(&mut self, lr: f32) -> Result<()> {
        check_lr(lr)?;
        self.config.optimizer.learning_rate = lr;
        Ok(())
    }

    /// `lr` kept as given; an invalid one is reported by the next call
    /// that validates the configuration (`check_config`).
    pub(crate) fn set_lr_unchecked(&mut self, lr: f32) {
        self.config.optimizer.learning_rate = lr;
    }

    /// Replace lr, betas, epsilon and weight decay (validated first; the
    /// state and the quantization are kept).
    #[cfg_attr(not(feature = "python"), allow(dead_code))] // the torch adapter's
    pub(crate) fn set_optimizer_config(&mut self, o: Adam4bitOptimizerConfig) -> Result<()> {
        o.validate()?;
        self.config.optimizer = o;
        Ok(())
    }

    pub(crate) fn memory_usage(&self) -> StateMemoryStats {
        let n = self.state.elements();
        StateMemoryStats {
            momentum_elements: n,
            variance_elements: n,
            third_moment_elements: 0,
            total_bytes: self.state.bytes(),
            num_parameters: n,
        }
    }

    /// `1 - total_bytes / (8 * elements)`, 0 before any state exists.
    pub(crate) fn memory_savings(&self) -> f32 {
        let n = self.state.elements();
        if n == 0 {
            0.0
        } else {
            (1.0 - self.state.bytes() as f64 / (8.0 * n as f64)) as f32
        }
    }

    pub(crate) fn reset_state(&mut self) {
        self.state = OptimizerState::default();
        self.accum.clear();
        self.bound.clear();
    }

    pub(crate) fn num_parameters(&self) -> usize {
        self.state.elements()
    }

    /// Replace config and state (checked by the checkpoint reader); clears
    /// pending accumulation and unnamed-parameter bindings.
    pub(crate) fn restore(&mut self, config: Adam4bitConfig, state: OptimizerState) {
        self.codecs = codecs_for(&config);
        self.config = config;
        self.state = state;
        self.accum.clear();
        self.bound.clear();
    }
}
