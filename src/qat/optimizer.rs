//! `QatOptimizer`: AdamW on full-precision masters with a fake-quantized view.

pub use super::element::Master;

use super::config::{QatConfig, QuantTarget, RoundingMode};
use super::dispatch::Kernels;
use super::fake::{fake_quant_fp8, fake_quant_int, IntGrid, Rounding};
use super::format::{Coef, CommitStep, Quantizer};
use super::params::{finite_minmax, QuantParams};
use super::rng::stream_key;
use crate::error::{QuantError, Result};
use crate::simd::SimdLevel;

/// QAT optimizer: owns the AdamW moments and the fake-quantized view of the
/// caller-owned master weights.
///
/// Stochastic rounding draws from a stream keyed by `(seed, step)`, indexed
/// by element, so results never depend on the thread count. The view made at
/// construction uses step 0; step `t` (1-based) uses step `t`.
///
/// [`QatOptimizer::step`] is transactional: if it returns an error, master,
/// moments, step count, parameters and view are exactly as before.
#[derive(Clone, Debug, PartialEq)]
pub struct QatOptimizer<T: Master> {
    pub(crate) config: QatConfig,
    pub(crate) seed: u64,
    pub(crate) step: u64,
    pub(crate) m: Vec<T>,
    pub(crate) v: Vec<T>,
    pub(crate) quantized: Vec<T>,
    pub(crate) params: Option<QuantParams>,
}

fn rounding(config: &QatConfig, seed: u64, step: u64) -> Rounding {
    match config.rounding {
        RoundingMode::Nearest => Rounding::Nearest,
        RoundingMode::Stochastic => Rounding::Stochastic {
            key: stream_key(seed, step),
        },
    }
}

/// Calibrate `x` for `config` (None for FP8 targets).
fn calibrate_for(
    config: &QatConfig,
    min: f64,
    max: f64,
) -> Result<(Option<QuantParams>, Quantizer)> {
    match config.target {
        QuantTarget::Int(d) => {
            let p = QuantParams::from_minmax(min, max, d, config.scheme)?;
            Ok((Some(p), Quantizer::Int(IntGrid::new(&p))))
        }
        QuantTarget::Fp8(f) => Ok((None, Quantizer::Fp8(f))),
    }
}

fn first_non_finite<T: Master>(x: &[T]) -> Option<usize> {
    x.iter().position(|&v| !v.into().is_finite())
}

impl<T: Master> QatOptimizer<T> {
    /// An optimizer for `master`, with the view derived from it at once.
    ///
    /// Errors: invalid hyper-parameters, an empty or non-finite master, and
    /// calibration failures (an all-zero master has no integer scale).
    pub fn new(master: &[T], config: QatConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        if master.is_empty() {
            return Err(QuantError::InvalidState(
                "master: expected at least one weight, got an empty array".into(),
            ));
        }
        let (min, max) = finite_minmax(master, "master")?;
        let (params, _) = calibrate_for(&config, min, max)?;
        let mut quantized = vec![T::ZERO; master.len()];
        let r = rounding(&config, seed, 0);
        match (config.target, &params) {
            (QuantTarget::Int(_), Some(p)) => fake_quant_int(master, &mut quantized, p, r)?,
            (QuantTarget::Fp8(f), _) => fake_quant_fp8(master, &mut quantized, f, r)?,
            (QuantTarget::Int(_), None) => unreachable!("integer targets always calibrate"),
        }
        Ok(QatOptimizer {
            config,
            seed,
            step: 0,
            m: vec![T::ZERO; master.len()],
            v: vec![T::ZERO; master.len()],
            quantized,
            params,
        })
    }

    /// The fake-quantized view of the master after the last step.
    pub fn quantized_weights(&self) -> &[T] {
        &self.quantized
    }

    /// The integer parameters in effect (None for FP8 targets).
    pub fn quant_params(&self) -> Option<&QuantParams> {
        self.params.as_ref()
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &QatConfig {
        &self.config
    }

    /// The seed of the stochastic-rounding streams.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.quantized.len()
    }

    /// True when there are no weights (never, once constructed).
    pub fn is_empty(&self) -> bool {
        self.quantized.is_empty()
    }

    /// `(m, v)`, the AdamW moments.
    pub fn moments(&self) -> (&[T], &[T]) {
        (&self.m, &self.v)
    }

    /// One AdamW step on `master` in place, then recalibration and a new
    /// view. `seed` overrides the optimizer's stream seed for this step.
    ///
    /// Errors (nothing changes): a length mismatch, a non-finite gradient or
    /// master, an update that overflows, a degenerate calibration.
    pub fn step(&mut self, master: &mut [T], grad: &[T], seed: Option<u64>) -> Result<()> {
        self.step_with(Kernels::in_force(), master, grad, seed)
    }

    /// [`Self::step`] at a given SIMD level (tests compare levels); an
    /// error, and no change, for a level above the one in force.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn step_at(
        &mut self,
        level: SimdLevel,
        master: &mut [T],
        grad: &[T],
        seed: Option<u64>,
    ) -> Result<()> {
        self.step_with(Kernels::at(level)?, master, grad, seed)
    }

    fn step_with(
        &mut self,
        kernels: Kernels,
        master: &mut [T],
        grad: &[T],
        seed: Option<u64>,
    ) -> Result<()> {
        let n = self.quantized.len();
        if master.len() != n {
            return Err(QuantError::dims("master", n, master.len()));
        }
        if grad.len() != n {
            return Err(QuantError::dims("grad", n, grad.len()));
        }
        let t = self
            .step
            .checked_add(1)
            .ok_or_else(|| QuantError::InvalidState("step count overflow".into()))?;
        let c = &self.config;
        let coef = Coef::<T>::new(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t);
        let stats = kernels.dry(master, grad, &self.m, &self.v, &coef);
        if stats.non_finite {
            return Err(self.diagnose(master, grad));
        }
        let (params, quant) = calibrate_for(&self.config, stats.min, stats.max)?;
        // Nothing can fail from here on.
        let r = rounding(&self.config, seed.unwrap_or(self.seed), t);
        let step = CommitStep {
            coef: &coef,
            quant,
            rounding: r,
        };
        let buffers = (master, grad, &mut self.m[..], &mut self.v[..]);
        kernels.commit(step, buffers, &mut self.quantized);
        self.params = params;
        self.step = t;
        Ok(())
    }

    /// The error for a dry pass that met a non-finite value.
    fn diagnose(&self, master: &[T], grad: &[T]) -> QuantError {
        if let Some(i) = first_non_finite(grad) {
            let g: f64 = grad[i].into();
            return QuantError::arg(format!("grad: non-finite value {g} at index {i}"));
        }
        if let Some(i) = first_non_finite(master) {
            let w: f64 = master[i].into();
            return QuantError::arg(format!("master: non-finite value {w} at index {i}"));
        }
        QuantError::arg(format!(
            "grad: the AdamW update overflows {} (a moment or the master becomes non-finite; \
             max |grad| is {:e})",
            T::DTYPE,
            grad.iter().fold(0.0f64, |a, &g| a.max(g.into().abs()))
        ))
    }

    /// Rebuild from parts (deserialization), validating every invariant.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        config: QatConfig,
        seed: u64,
        step: u64,
        m: Vec<T>,
        v: Vec<T>,
        quantized: Vec<T>,
        params: Option<QuantParams>,
    ) -> Result<Self> {
        config.validate()?;
        let n = quantized.len();
        if n == 0 {
            return Err(QuantError::InvalidState("empty optimizer state".into()));
        }
        if m.len() != n || v.len() != n {
            return Err(QuantError::dims("moments", n, m.len().max(v.len())));
        }
        match (config.target, &params) {
            (QuantTarget::Int(d), Some(p)) => {
                let (qmin, qmax) = d.range(config.scheme);
                QuantParams::new(p.scale, p.zero_point, p.qmin, p.qmax)?;
                if (p.qmin, p.qmax) != (qmin, qmax) {
                    return Err(QuantError::InvalidState(
                        "quant params disagree with the target's range".into(),
                    ));
                }
            }
            (QuantTarget::Fp8(_), None) => {}
            _ => {
                return Err(QuantError::InvalidState(
                    "quant params present for an FP8 target or missing for an integer one".into(),
                ))
            }
        }
        Ok(QatOptimizer {
            config,
            seed,
            step,
            m,
            v,
            quantized,
            params,
        })
    }
}
