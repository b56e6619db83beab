//! `QatOptimizer`: AdamW on full-precision masters with a fake-quantized view.

pub use super::element::Master;

use super::config::{QatConfig, QuantTarget, RoundingMode};
use super::deploy::{fill_view, QatGrid};
use super::dispatch::Kernels;
use super::fake::{fake_quant_fp8, fake_quant_int, IntGrid, Rounding};
use super::format::{Coef, CommitStep, Quantizer};
use super::params::{finite_minmax, QuantParams};
use super::rng::stream_key;
use crate::error::{QuantError, Result};
use crate::simd::SimdLevel;
use ndarray::Array1;

/// QAT optimizer: owns the AdamW moments and the fake-quantized view of the
/// caller-owned master weights.
///
/// The FP32/FP64 master itself is owned by the caller and passed to every
/// step; the optimizer updates it in place and re-derives the view from it.
/// `T` is `f64` (the default) or `f32`.
///
/// Stochastic rounding takes one 64-bit key per view: [`QatOptimizer::new`]
/// and [`QatOptimizer::step`] draw it from the caller's `rng` (exactly one
/// `next_u64` per successful call, whatever the rounding mode), the
/// `*_seeded` slice methods derive it from `(seed, step)`. Element `i` then
/// rounds with a uniform that is a pure function of `(key, i)`, so results
/// never depend on the thread count (docs/qat.md, docs/rust.md).
///
/// Every step is transactional: if it returns an error, master, moments,
/// step count, parameters, view and `rng` are exactly as before.
///
/// ```
/// use ndarray::array;
/// use quantrs::qat::{IntDtype, QatConfig, QatOptimizer, QuantScheme, QuantTarget, RoundingMode};
/// use rand::{rngs::StdRng, SeedableRng};
///
/// let mut rng = StdRng::seed_from_u64(0);
/// let config = QatConfig::new(
///     QuantTarget::Int(IntDtype::Int8),
///     QuantScheme::Symmetric,
///     RoundingMode::Nearest,
///     0.01,
/// );
/// let mut master = array![0.5f64, -1.0, 0.25, 1.0];
/// let mut opt = QatOptimizer::new(&master, config, &mut rng)?;
/// opt.step(&mut master, &array![1.0, -1.0, 1.0, -1.0], &mut rng)?;
/// assert_eq!(opt.step_count(), 1);
/// // The first AdamW step moves each weight by lr against its gradient's sign.
/// assert!((master[0] - 0.49).abs() < 1e-9);
/// // The view sits on the int8 grid of scale max|w| / 127.
/// let scale = opt.quant_params().unwrap().scale;
/// for q in opt.quantized_weights() {
///     assert!(((q / scale).round() - q / scale).abs() < 1e-9);
/// }
/// # Ok::<(), quantrs::QuantError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QatOptimizer<T: Master = f64> {
    pub(crate) config: QatConfig,
    pub(crate) seed: u64,
    pub(crate) step: u64,
    pub(crate) m: Vec<T>,
    pub(crate) v: Vec<T>,
    pub(crate) quantized: Array1<T>,
    pub(crate) params: Option<QuantParams>,
    pub(crate) grid: QatGrid,
}

fn rounding(config: &QatConfig, key: u64) -> Rounding {
    match config.rounding {
        RoundingMode::Nearest => Rounding::Nearest,
        RoundingMode::Stochastic => Rounding::Stochastic { key },
    }
}

/// Calibrate `x` for `config` (None for FP8 targets); the device step
/// (`gpu::qat`) calibrates with this very function.
pub(crate) fn calibrate_for(
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
    /// An optimizer for the slice `master` whose stochastic rounding is keyed
    /// by `(seed, step)` (the Python binding's path); the view is derived at
    /// once with step 0. [`QatOptimizer::new`] is the form that draws the key
    /// from a caller's `rng`.
    ///
    /// Errors: invalid hyper-parameters, an empty or non-finite master, and
    /// calibration failures (an all-zero master has no integer scale).
    pub fn with_seed(master: &[T], config: QatConfig, seed: u64) -> Result<Self> {
        Self::with_key(master, config, QatGrid::PerTensor, seed, |_| {
            stream_key(seed, 0)
        })
    }

    /// [`Self::with_seed`] on `grid`: with [`QatGrid::Deploy`] the view of the
    /// row-major `[out, in]` master is the serving layer's dequantized weight
    /// (docs/qat.md "Deploy grid"; no integer parameters: `quant_params` is
    /// None). Errors as `with_seed`, and a grid that does not fit the
    /// configuration or the master's length.
    ///
    /// ```
    /// use quantrs::qat::{IntDtype, QatConfig, QatGrid, QatOptimizer, QuantTarget};
    /// use quantrs::QuantizedWeight;
    ///
    /// let (out_f, in_f) = (2, 4);
    /// let mut w = vec![0.5f32, -1.0, 0.25, 1.0, 0.1, 0.2, -0.3, 0.4]; // [out, in]
    /// let config = QatConfig::with_target(QuantTarget::Int(IntDtype::Int4));
    /// let grid = QatGrid::deploy(out_f, in_f, 2);
    /// let mut opt = QatOptimizer::with_grid(&w, config, grid, 0)?;
    /// opt.step_seeded(&mut w, &[1.0; 8], None)?;
    /// // The serving weight ([in, out] layout) built from the master holds the view.
    /// let wt: Vec<f32> = (0..in_f * out_f).map(|k| w[(k % out_f) * in_f + k / out_f]).collect();
    /// let served = QuantizedWeight::quantize_grouped(&wt, in_f, out_f, 2)?.dequantize();
    /// for o in 0..out_f {
    ///     for i in 0..in_f {
    ///         assert_eq!(opt.quantized_slice()[o * in_f + i], served[i * out_f + o]);
    ///     }
    /// }
    /// # Ok::<(), quantrs::QuantError>(())
    /// ```
    pub fn with_grid(master: &[T], config: QatConfig, grid: QatGrid, seed: u64) -> Result<Self> {
        Self::with_key(master, config, grid, seed, |_| stream_key(seed, 0))
    }

    /// [`Self::with_seed`] with the view's key from `key` (called once,
    /// after validation, with `seed`).
    pub(crate) fn with_key(
        master: &[T],
        config: QatConfig,
        grid: QatGrid,
        seed: u64,
        key: impl FnOnce(u64) -> u64,
    ) -> Result<Self> {
        config.validate()?;
        if master.is_empty() {
            return Err(QuantError::InvalidState(
                "master: expected at least one weight, got an empty array".into(),
            ));
        }
        grid.validate(&config, master.len())?;
        let (min, max) = finite_minmax(master, "master")?;
        let mut quantized = vec![T::ZERO; master.len()];
        let r = rounding(&config, key(seed));
        let params = match grid {
            QatGrid::Deploy(g) => {
                fill_view(master, &mut quantized, config.target, &g)?;
                None
            }
            QatGrid::PerTensor => {
                let (params, _) = calibrate_for(&config, min, max)?;
                match (config.target, &params) {
                    (QuantTarget::Int(_), Some(p)) => fake_quant_int(master, &mut quantized, p, r)?,
                    (QuantTarget::Fp8(f), _) => fake_quant_fp8(master, &mut quantized, f, r)?,
                    (QuantTarget::Int(_), None) => {
                        unreachable!("integer targets always calibrate")
                    }
                }
                params
            }
        };
        Ok(QatOptimizer {
            config,
            seed,
            step: 0,
            m: vec![T::ZERO; master.len()],
            v: vec![T::ZERO; master.len()],
            quantized: Array1::from_vec(quantized),
            params,
            grid,
        })
    }

    /// The grid of the view.
    pub fn grid(&self) -> QatGrid {
        self.grid
    }

    /// The fake-quantized view as a slice (see [`Self::quantized_weights`]).
    pub fn quantized_slice(&self) -> &[T] {
        self.quantized
            .as_slice()
            .expect("the view is built from a Vec: standard layout")
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

    /// Set the learning rate (finite, >= 0) for the next steps.
    ///
    /// The setters change only the configuration the next step reads (the
    /// moments, the step count and the view are kept), and validate first:
    /// an error names the argument and changes nothing.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.reconfigure(|c| c.lr = lr)
    }

    /// Set the moment decays, each in [0, 1) (both or neither change).
    pub fn set_betas(&mut self, beta1: f64, beta2: f64) -> Result<()> {
        self.reconfigure(|c| (c.beta1, c.beta2) = (beta1, beta2))
    }

    /// Set the denominator's epsilon (finite, > 0).
    pub fn set_eps(&mut self, eps: f64) -> Result<()> {
        self.reconfigure(|c| c.eps = eps)
    }

    /// Set the decoupled weight decay (finite, >= 0).
    pub fn set_weight_decay(&mut self, weight_decay: f64) -> Result<()> {
        self.reconfigure(|c| c.weight_decay = weight_decay)
    }

    /// Set all five AdamW hyper-parameters at once (all or none change).
    pub fn set_hyper(
        &mut self,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    ) -> Result<()> {
        self.reconfigure(|c| {
            (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) = (lr, beta1, beta2, eps, weight_decay)
        })
    }

    /// Set how the next views round; the current view stays as it was
    /// rounded. (Target and scheme have no setter: the integer parameters in
    /// effect belong to the grid they were calibrated for.) An error, and no
    /// change, for stochastic rounding on the deploy grid (the serving
    /// quantizers round to nearest).
    pub fn set_rounding(&mut self, rounding: RoundingMode) -> Result<()> {
        self.reconfigure(|c| c.rounding = rounding)
    }

    /// Set the seed of the stochastic-rounding streams of the next steps.
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
    }

    /// Replace the step count and the moments (a restored training state):
    /// `m` and `v` of the optimizer's length, finite, `v >= 0`. Checked
    /// first; on error nothing changes. The view is kept until the next step.
    pub fn set_moments(&mut self, step: u64, m: &[T], v: &[T]) -> Result<()> {
        let n = self.quantized.len();
        for (name, x) in [("m", m), ("v", v)] {
            if x.len() != n {
                return Err(QuantError::dims(name, n, x.len()));
            }
        }
        if let Some(i) = first_non_finite(m) {
            let x: f64 = m[i].into();
            return Err(QuantError::arg(format!(
                "m: non-finite value {x} at index {i}"
            )));
        }
        if let Some(i) = v
            .iter()
            .position(|&x| !(x.into().is_finite() && x.into() >= 0.0))
        {
            let x: f64 = v[i].into();
            return Err(QuantError::arg(format!(
                "v: expected finite values >= 0, got {x} at index {i}"
            )));
        }
        if step == u64::MAX {
            return Err(QuantError::arg("step: expected a value below 2**64 - 1"));
        }
        self.step = step;
        self.m.copy_from_slice(m);
        self.v.copy_from_slice(v);
        Ok(())
    }

    /// Apply `change` to a copy of the configuration and adopt the copy only
    /// if it validates.
    fn reconfigure(&mut self, change: impl FnOnce(&mut QatConfig)) -> Result<()> {
        let mut c = self.config;
        change(&mut c);
        c.validate()?;
        self.grid.validate(&c, self.len())?;
        self.config = c;
        Ok(())
    }

    /// `(m, v)`, the AdamW moments.
    pub fn moments(&self) -> (&[T], &[T]) {
        (&self.m, &self.v)
    }

    /// One AdamW step on the slice `master` in place, then recalibration and
    /// a new view keyed by `(seed, step)`; `seed` overrides the optimizer's
    /// stream seed for this step. [`QatOptimizer::step`] is the form that draws
    /// the key from a caller's `rng`.
    ///
    /// Errors (nothing changes): a length mismatch, a non-finite gradient or
    /// master, an update that overflows, a degenerate calibration.
    pub fn step_seeded(&mut self, master: &mut [T], grad: &[T], seed: Option<u64>) -> Result<()> {
        let seed = seed.unwrap_or(self.seed);
        self.step_with(Kernels::in_force(), master, grad, |t| stream_key(seed, t))
    }

    /// One step whose view key comes from `key(step)`, called once, only
    /// when the step cannot fail any more.
    pub(crate) fn step_keyed(
        &mut self,
        master: &mut [T],
        grad: &[T],
        key: impl FnOnce(u64) -> u64,
    ) -> Result<()> {
        self.step_with(Kernels::in_force(), master, grad, key)
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
        let seed = seed.unwrap_or(self.seed);
        self.step_with(Kernels::at(level)?, master, grad, |t| stream_key(seed, t))
    }

    fn step_with(
        &mut self,
        kernels: Kernels,
        master: &mut [T],
        grad: &[T],
        key: impl FnOnce(u64) -> u64,
    ) -> Result<()> {
        let n = self.quantized.len();
        if master.len() != n {
            return Err(QuantError::dims("master", n, master.len()));
        }
        if grad.len() != n {
            return Err(QuantError::dims("grad", n, grad.len()));
        }
        let (t, coef) = next_step::<T>(&self.config, self.step)?;
        let stats = kernels.dry(master, grad, &self.m, &self.v, &coef);
        if stats.non_finite {
            return Err(diagnose(master, grad));
        }
        let (params, quant) = match self.grid {
            QatGrid::PerTensor => calibrate_for(&self.config, stats.min, stats.max)?,
            QatGrid::Deploy(_) => (None, Quantizer::Later),
        };
        // Nothing can fail from here on (the deploy view's only error, a
        // non-finite master, is excluded by the dry pass).
        let r = rounding(&self.config, key(t));
        let step = CommitStep {
            coef: &coef,
            quant,
            rounding: r,
        };
        let buffers = (&mut *master, grad, &mut self.m[..], &mut self.v[..]);
        let view = self
            .quantized
            .as_slice_mut()
            .expect("the view is built from a Vec: standard layout");
        kernels.commit(step, buffers, view);
        if let QatGrid::Deploy(g) = self.grid {
            fill_view(master, view, self.config.target, &g)?;
        }
        self.params = params;
        self.step = t;
        Ok(())
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
        let parts = (m, v, quantized);
        Self::from_parts_on(config, QatGrid::PerTensor, seed, step, parts, params)
    }

    /// [`Self::from_parts`] on `grid` (a deploy grid has no integer
    /// parameters); `parts` are `(m, v, view)`.
    pub(crate) fn from_parts_on(
        config: QatConfig,
        grid: QatGrid,
        seed: u64,
        step: u64,
        (m, v, quantized): (Vec<T>, Vec<T>, Vec<T>),
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
        grid.validate(&config, n)?;
        let per_tensor = grid == QatGrid::PerTensor;
        match (config.target, &params) {
            (_, None) if !per_tensor => {}
            (QuantTarget::Int(d), Some(p)) if per_tensor => {
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
                    "quant params present for an FP8 target or a deploy grid, or missing for \
                     an integer one"
                        .into(),
                ))
            }
        }
        Ok(QatOptimizer {
            config,
            seed,
            step,
            m,
            v,
            quantized: Array1::from_vec(quantized),
            params,
            grid,
        })
    }
}

/// The number of the step after `step` and its AdamW constants (an error
/// when the count would overflow); shared with the device step (`gpu::qat`).
pub(crate) fn next_step<T: Master>(c: &QatConfig, step: u64) -> Result<(u64, Coef<T>)> {
    let t = step
        .checked_add(1)
        .ok_or_else(|| QuantError::InvalidState("step count overflow".into()))?;
    Ok((
        t,
        Coef::<T>::new(c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, t),
    ))
}

/// The error of a step whose dry pass met a non-finite value: the first
/// non-finite gradient, else master, else the overflow (shared with the
/// device step, which reads host copies of both).
pub(crate) fn diagnose<T: Master>(master: &[T], grad: &[T]) -> QuantError {
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
