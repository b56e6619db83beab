//! Quantization-aware training (docs/qat.md): `QatOptimizer`.
//!
//! The optimizer keeps full-precision master weights (owned by the caller,
//! f64 or f32) and AdamW moments, and after every step re-derives a
//! fake-quantized view of the master: the values the forward pass uses.
//!
//! - `config`: targets (int8 / int4 / FP8 E4M3 / E5M2), schemes, rounding.
//! - `deploy`: the grid of the view, per tensor or the serving layer's
//!   (INT4 per group, INT8 per output channel, FP8 E4M3 per tensor).
//! - `params`: integer quantization parameters and calibration (per-tensor
//!   min/max or absmax, percentile, per-channel).
//! - `fake`: integer and FP8 fake quantization and the straight-through
//!   estimator backward (Bengio, Leonard & Courville 2013, "Estimating or
//!   propagating gradients through stochastic neurons").
//! - `rng`: the counter-based generator behind stochastic rounding.
//! - `optimizer`: `QatOptimizer`, the transactional AdamW step; `array_api`:
//!   its surface on ndarray `Array1` and a `rand::Rng` (docs/rust.md).
//! - `serde`: the byte format behind pickling.
//!
//! Integer fake quantization follows the usual affine scheme (Jacob et al.
//! 2018, "Quantization and training of neural networks for efficient
//! integer-arithmetic-only inference"): `q = clamp(round(x / scale + zp),
//! qmin, qmax)`, `fake = (q - zp) * scale`.
//!
//! Modules import one way: `optimizer` (public type, validation) ->
//! `dispatch` (kernels chosen once per step from proof tokens) -> `x86`
//! (the bodies compiled per instruction set) -> `format` (the bodies, the
//! scalar twin) -> `fake`, `element`, `rng`, `params`, `config`.

mod array_api;
mod config;
mod deploy;
#[cfg(test)]
mod deploy_tests;
mod dispatch;
mod element;
mod fake;
pub(crate) mod format;
pub(crate) mod optimizer;
mod params;
pub(crate) mod rng;
pub(crate) mod serde;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use config::{IntDtype, QatConfig, QuantScheme, QuantTarget, RoundingMode};
pub use deploy::{DeployGrid, QatGrid};
pub use element::Master;
pub use fake::{
    fake_quant_backward, fake_quant_fp8, fake_quant_int, fake_quant_per_channel, quantize_int,
    Code, Rounding,
};
pub use optimizer::QatOptimizer;
pub use params::{calibrate, calibrate_per_channel, QuantParams};
pub use rng::CounterRng;
