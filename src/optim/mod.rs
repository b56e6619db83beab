//! 4-bit Adam / AdamW (SPEC section 6): m and v stored as packed 4-bit
//! block-quantized codes, about one byte of state per parameter.
//!
//! - m: signed code book (NF4 by default; linear int4, dynamic-exponent, or
//!   an 8-bit dynamic-tree map) on the block's absmax (Dettmers et al.,
//!   "8-bit Optimizers via Block-wise Quantization", 2022; QLoRA's NF4).
//! - v: an unsigned map with no zero ([`VarianceMap`]); a v that decodes to
//!   0 makes `m / (sqrt(v) + eps)` explode (the "zero-point problem" of Li
//!   et al., "Memory Efficient Optimizers with 4-bit States", 2023, lpmm).
//! - block scales optionally double-quantized ([`scales`]), v's rounded
//!   without bias ([`dither`]); lpmm's rank-1 normalization of v for 2-D
//!   parameters as an option.
//! - the step is fused per group of 256 blocks ([`kernel`]): decode, update,
//!   encode, with AVX-512 for the look-up and the nearest-code search and
//!   rayon over groups; each group's arithmetic is independent of the thread
//!   count, so results are too.

pub mod adam;
pub mod checkpoint;
pub mod codebook;
pub mod config;
pub mod dither;
pub mod kernel;
#[cfg(target_arch = "x86_64")]
mod kernel_avx512;
pub mod scales;
pub mod state;

pub use adam::{Adam4bit, Adam4bitCore, AdamW4bit};
pub use checkpoint::Tensors;
pub use codebook::VarianceMap;
pub use config::{
    Adam4bitConfig, Adam4bitOptimizerConfig, AdvancedQuantizationConfig, QuantizationMethod,
};
pub use state::{OptimizerState, ParamState};

use crate::error::Result;

/// A parameter to update in place: its optional name (the state key is
/// `"n:<name>"`; unnamed parameters are keyed `"p:<i>"` by their buffer
/// address and length in first-use order), shape and data.
pub struct ParamMut<'a> {
    pub name: Option<&'a str>,
    pub shape: &'a [usize],
    pub data: &'a mut [f32],
}

/// A parameter that is only identified (gradient accumulation).
pub struct ParamRef<'a> {
    pub name: Option<&'a str>,
    pub shape: &'a [usize],
    pub data: &'a [f32],
}

/// Memory of the optimizer state, measured from the live buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StateMemoryStats {
    pub momentum_elements: usize,
    pub variance_elements: usize,
    pub third_moment_elements: usize,
    /// Bytes of every state buffer (codes, scales, rank-1 statistics).
    pub total_bytes: usize,
    pub num_parameters: usize,
}

/// The seed's optimizer interface.
pub trait Optimizer {
    /// Update `param` in place from `grad` (validated first).
    fn update(&mut self, param: ParamMut<'_>, grad: &[f32]) -> Result<()>;
    /// Clear accumulated gradients.
    fn zero_grad(&mut self);
    /// Advance the step counter (once per iteration, after the updates).
    fn step(&mut self);
    fn get_lr(&self) -> f32;
    fn set_lr(&mut self, lr: f32) -> Result<()>;
    /// Add `grad` to `param`'s f32 accumulation buffer; returns its key.
    fn accumulate_grad(&mut self, param: ParamRef<'_>, grad: &[f32]) -> Result<String>;
    /// Update every accumulated parameter (given with its key) with the
    /// mean gradient, then clear the buffers. Does not call `step`.
    fn apply_accumulated_grads(
        &mut self,
        accumulation_steps: usize,
        params: &mut [(String, ParamMut<'_>)],
    ) -> Result<()>;
}

/// The seed's checkpointing interface.
pub trait StatefulOptimizer {
    type Config;
    type State;
    fn config(&self) -> &Self::Config;
    fn state(&self) -> &Self::State;
    /// Lossless: codes, scales, step and config.
    fn state_dict(&self) -> Result<Tensors>;
    /// Validates everything; unchanged on error.
    fn load_state_dict(&mut self, state: Tensors) -> Result<()>;
    fn memory_usage(&self) -> StateMemoryStats;
    fn reset_state(&mut self);
    fn num_parameters(&self) -> usize;
    fn save_state(&self, path: &std::path::Path) -> Result<()>;
    fn load_state(&mut self, path: &std::path::Path) -> Result<()>;
}
