//! The optimizer traits ([`Optimizer`], [`StatefulOptimizer`]; docs/rust.md)
//! and the argument and statistics types they
//! use (a leaf: shared by the engine, the checkpoints and the public types).

use std::collections::BTreeMap;

use ndarray::{ArrayViewD, ArrayViewMutD};

use crate::error::Result;
use crate::st::OwnedTensor;

/// Named tensors of a state dict.
pub type Tensors = BTreeMap<String, OwnedTensor>;

/// A parameter to update in place: its optional name (the state key is
/// `"n:<name>"`; unnamed parameters are keyed `"p:<i>"` by their buffer
/// address and length in first-use order), shape and data.
pub struct ParamMut<'a> {
    /// The state key's name (`None`: keyed by buffer address and length).
    pub name: Option<&'a str>,
    /// The parameter's shape.
    pub shape: &'a [usize],
    /// The values, updated in place.
    pub data: &'a mut [f32],
}

/// A parameter that is only identified (gradient accumulation).
pub struct ParamRef<'a> {
    /// The state key's name (`None`: keyed by buffer address and length).
    pub name: Option<&'a str>,
    /// The parameter's shape.
    pub shape: &'a [usize],
    /// The values.
    pub data: &'a [f32],
}

/// Memory of the optimizer state, measured from the live buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StateMemoryStats {
    /// Elements of the first moment.
    pub momentum_elements: usize,
    /// Elements of the second moment.
    pub variance_elements: usize,
    /// Elements of a third moment (0: Adam keeps none).
    pub third_moment_elements: usize,
    /// Bytes of every state buffer (codes, scales, rank-1 statistics).
    pub total_bytes: usize,
    /// Parameters (elements) with state.
    pub num_parameters: usize,
}

/// The optimizer interface, on ndarray views (docs/rust.md).
///
/// A parameter is an [`ArrayViewMutD`] of any shape in standard (C
/// contiguous) layout: another layout is an error, never a silent copy. An
/// unnamed parameter's state is keyed by its buffer's address and length,
/// so pass the same array every iteration (`w.view_mut().into_dyn()`).
/// Every method validates first; on error nothing changes.
pub trait Optimizer {
    /// Updates `parameter` in place from `grad` (same shape).
    fn update(
        &mut self,
        parameter: ArrayViewMutD<'_, f32>,
        grad: ArrayViewD<'_, f32>,
    ) -> Result<()>;
    /// Clears all accumulated gradients.
    fn zero_grad(&mut self);
    /// Advances the step counter (once per iteration, after the updates).
    fn step(&mut self);
    /// The current learning rate.
    fn get_lr(&self) -> f32;
    /// Sets a new learning rate. Never fails: a value that is not finite
    /// and >= 0 is kept and reported as an error by the next call that needs
    /// it (`update`, `accumulate_grad`, `apply_accumulated_grads`,
    /// `state_dict`, `save_state`), as with `new`; [`Self::try_set_lr`]
    /// reports it here instead.
    fn set_lr(&mut self, lr: f32);
    /// [`Self::set_lr`], validated: finite and >= 0, else an error and no
    /// change.
    fn try_set_lr(&mut self, lr: f32) -> Result<()>;
    /// Adds `grad` to `parameter`'s float32 accumulation buffer (gradient
    /// accumulation); the parameter is not changed yet.
    fn accumulate_grad(
        &mut self,
        parameter: ArrayViewMutD<'_, f32>,
        grad: ArrayViewD<'_, f32>,
    ) -> Result<()>;
    /// Updates every parameter of `parameters` that has an accumulated
    /// gradient with the mean `sum / accumulation_steps`, then clears the
    /// buffers. Does not call [`Self::step`].
    ///
    /// A safe Rust optimizer cannot keep the borrowed views of
    /// `accumulate_grad` alive until this call, so the caller hands them
    /// back here (any order; matched by buffer).
    fn apply_accumulated_grads(
        &mut self,
        accumulation_steps: usize,
        parameters: &mut [ArrayViewMutD<'_, f32>],
    ) -> Result<()>;
}

/// Checkpointing: the configuration, the state and their serialization.
pub trait StatefulOptimizer {
    /// The configuration type.
    type Config;
    /// The state type.
    type State;
    /// The configuration.
    fn config(&self) -> &Self::Config;
    /// The quantized state.
    fn state(&self) -> &Self::State;
    /// Lossless: codes, scales, step and config.
    fn state_dict(&self) -> Result<Tensors>;
    /// Validates everything; unchanged on error.
    fn load_state_dict(&mut self, state: Tensors) -> Result<()>;
    /// Memory of the state, from the live buffers.
    fn memory_usage(&self) -> StateMemoryStats;
    /// Drop every parameter's state and the step count.
    fn reset_state(&mut self);
    /// Elements with state.
    fn num_parameters(&self) -> usize;
    /// Write `state_dict` to a safetensors file atomically.
    fn save_state(&self, path: &std::path::Path) -> Result<()>;
    /// Read a file written by `save_state` (validated; unchanged on error).
    fn load_state(&mut self, path: &std::path::Path) -> Result<()>;
}
