//! 4-bit Adam / AdamW (docs/optim.md): m and v stored as packed 4-bit
//! block-quantized codes, about one byte of state per parameter.
//!
//! - m: signed code book (NF4 by default; linear int4, dynamic-exponent, or
//!   an 8-bit dynamic-tree map) on the block's absmax (Dettmers et al.,
//!   "8-bit Optimizers via Block-wise Quantization", 2022; QLoRA's NF4).
//! - v: an unsigned map with no zero ([`VarianceMap`]); a v that decodes to
//!   0 makes `m / (sqrt(v) + eps)` explode (the "zero-point problem" of Li
//!   et al., "Memory Efficient Optimizers with 4-bit States", 2023, lpmm).
//! - block scales optionally double-quantized (`crate::scales`), v's
//!   rounded without bias (`dither.rs`); lpmm's rank-1 normalization of v
//!   for 2-D parameters as an option.
//! - the step is fused per group of 256 blocks (`format.rs`): decode,
//!   update, encode, with SIMD kernels written once over a vector trait
//!   (`kernel.rs` over `crate::simd::F32Lanes`, instantiated for AVX-512 in `avx512.rs`
//!   and AVX2 in `avx2.rs`) for the look-up and the nearest-code search and
//!   rayon over groups (`state.rs`; on AVX2, runs of groups with each
//!   group's pass 1 interleaved with the previous group's pass 2); each
//!   group's arithmetic is independent of the thread count, so results are
//!   too.
//!
//! Modules import one way: `adam` (public types) -> `array_api` (the
//! ndarray views of [`Optimizer`], checked for layout) -> `engine`
//! (validation, keys, accumulation) -> `state` (parallel step) -> `dither`
//! (its AVX-512 and AVX2 twins `dither_avx512`, `dither_avx2`) -> `dispatch` (kernels chosen once per optimizer from proof tokens) ->
//! `avx2`, `avx512` -> `kernel` -> `crate::simd` and the leaves `format`,
//! `codebook`; `multi` (`step_all`: one call over a list of optimizers, one
//! per parameter, as the torch adapter steps a group) sits above `engine`;
//! the scale codec is `crate::scales`; `checkpoint` reads and writes the
//! engine's state; `traits` and `config` are leaves.

mod adam;
mod array_api;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub(crate) mod checkpoint;
mod codebook;
pub(crate) mod config;
mod dispatch;
mod dither;
#[cfg(target_arch = "x86_64")]
mod dither_avx2;
#[cfg(target_arch = "x86_64")]
mod dither_avx512;
mod engine;
mod format;
#[cfg(target_arch = "x86_64")]
mod kernel;
mod multi;
#[cfg(test)]
mod row_layout_tests;
mod state;
#[cfg(target_arch = "x86_64")]
mod step_lanes;
#[cfg(test)]
mod tests;
mod traits;

pub use adam::{Adam4bit, AdamW4bit};
pub use codebook::VarianceMap;
pub use config::{
    Adam4bitConfig, Adam4bitOptimizerConfig, AdvancedQuantizationConfig, QuantizationMethod,
};
pub(crate) use engine::Adam4bitCore;
#[cfg(feature = "gpu")]
pub(crate) use engine::{
    accumulated, accumulated_mismatch, accumulation_divisor, check_accumulating, step_consts,
};
pub use multi::{step_all, StepItem};
// The device step (src/gpu/adam.rs) runs the same element math with the
// same code books and step constants.
pub use state::{OptimizerState, ParamState, RowLayout, Scales, VScales};
pub use traits::{Optimizer, ParamMut, ParamRef, StateMemoryStats, StatefulOptimizer, Tensors};
#[cfg(feature = "gpu")]
pub(crate) use {
    engine::codecs_for,
    format::{Codecs, MCodec, StepConsts},
};
