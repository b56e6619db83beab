//! Quantization-aware training (SPEC section 7, seed 000 `QatOptimizer`).
//!
//! The optimizer keeps full-precision master weights (owned by the caller,
//! f64 or f32) and AdamW moments, and after every step re-derives a
//! fake-quantized view of the master: the values the forward pass uses.
//!
//! - [`config`]: targets (int8 / int4 / FP8 E4M3 / E5M2), schemes, rounding.
//! - [`params`]: integer quantization parameters and calibration (per-tensor
//!   min/max or absmax, percentile, per-channel).
//! - [`fake`]: integer and FP8 fake quantization and the straight-through
//!   estimator backward (Bengio, Leonard & Courville 2013, "Estimating or
//!   propagating gradients through stochastic neurons").
//! - [`rng`]: the counter-based generator behind stochastic rounding.
//! - [`optimizer`]: `QatOptimizer`, the transactional AdamW step.
//! - [`serde`]: the byte format behind pickling.
//!
//! Integer fake quantization follows the usual affine scheme (Jacob et al.
//! 2018, "Quantization and training of neural networks for efficient
//! integer-arithmetic-only inference"): `q = clamp(round(x / scale + zp),
//! qmin, qmax)`, `fake = (q - zp) * scale`.

pub mod config;
mod element;
pub mod fake;
mod kernel;
pub mod optimizer;
pub mod params;
pub mod rng;
pub mod serde;

pub use config::{IntDtype, QatConfig, QuantScheme, QuantTarget, RoundingMode};
pub use element::{f64_to_f32_odd, fp8_round_slice, Master};
pub use fake::{
    fake_quant_backward, fake_quant_fp8, fake_quant_int, fake_quant_per_channel, fp8_stochastic,
    quantize_int, Code, Rounding,
};
pub use optimizer::QatOptimizer;
pub use params::{calibrate, calibrate_per_channel, finite_minmax, QuantParams};
pub use rng::CounterRng;
