//! `Adam4bit` and `AdamW4bit`, the public optimizers: thin types over the
//! shared engine ([`Adam4bitCore`]), implementing [`Optimizer`] and
//! [`StatefulOptimizer`] (docs/rust.md).

use ndarray::{ArrayViewD, ArrayViewMutD};

use super::array_api;
use super::checkpoint::{self, Tensors};
use super::config::{Adam4bitConfig, Adam4bitOptimizerConfig, AdvancedQuantizationConfig};
use super::engine::Adam4bitCore;
use super::state::{OptimizerState, RowLayout};
use super::traits::{Optimizer, ParamMut, ParamRef, StateMemoryStats, StatefulOptimizer};
use crate::error::Result;

fn hyper_parameters(
    learning_rate: f32,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
    weight_decay: f32,
) -> Adam4bitOptimizerConfig {
    Adam4bitOptimizerConfig {
        learning_rate,
        beta1,
        beta2,
        epsilon,
        weight_decay,
    }
}

fn both(
    optimizer: Adam4bitOptimizerConfig,
    quantization: AdvancedQuantizationConfig,
) -> Adam4bitConfig {
    Adam4bitConfig {
        optimizer,
        quantization,
    }
}

macro_rules! optimizer_type {
    ($name:ident, $decoupled:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Debug)]
        pub struct $name {
            pub(crate) core: Adam4bitCore,
        }

        impl $name {
            /// An optimizer with these hyper-parameters and the default
            /// quantization. Never fails: values outside their domain are
            /// kept and reported as an error (naming the field) by the first
            /// call that needs them (`update`, `accumulate_grad`,
            /// `apply_accumulated_grads`, `state_dict`, `save_state`);
            /// [`Self::try_new`] reports them here instead.
            pub fn new(
                learning_rate: f32,
                beta1: f32,
                beta2: f32,
                epsilon: f32,
                weight_decay: f32,
            ) -> Self {
                Self::with_quantization_config(
                    hyper_parameters(learning_rate, beta1, beta2, epsilon, weight_decay),
                    Default::default(),
                )
            }

            /// [`Self::new`] with an explicit quantization config; an
            /// invalid value in either half is reported as [`Self::new`]
            /// says.
            pub fn with_quantization_config(
                optimizer_config: Adam4bitOptimizerConfig,
                quantization_config: AdvancedQuantizationConfig,
            ) -> Self {
                $name {
                    core: Adam4bitCore::unvalidated(
                        both(optimizer_config, quantization_config),
                        $decoupled,
                    ),
                }
            }

            /// [`Self::new`], validated: an invalid value is an error here.
            pub fn try_new(
                learning_rate: f32,
                beta1: f32,
                beta2: f32,
                epsilon: f32,
                weight_decay: f32,
            ) -> Result<Self> {
                Self::try_with_quantization_config(
                    hyper_parameters(learning_rate, beta1, beta2, epsilon, weight_decay),
                    Default::default(),
                )
            }

            /// [`Self::with_quantization_config`], validated: an invalid
            /// value in either half is an error here.
            pub fn try_with_quantization_config(
                optimizer_config: Adam4bitOptimizerConfig,
                quantization_config: AdvancedQuantizationConfig,
            ) -> Result<Self> {
                Ok($name {
                    core: Adam4bitCore::new(
                        both(optimizer_config, quantization_config),
                        $decoupled,
                    )?,
                })
            }

            /// Memory saved relative to float32 AdamW (8 bytes per element),
            /// measured from the live buffers.
            pub fn memory_savings(&self) -> f32 {
                self.core.memory_savings()
            }

            /// Keep the state of parameters created or imported from now on
            /// in the row layout `rows` of a parameter sharded on dim 0
            /// ([`RowLayout`]: each parameter given as `[local rows, row
            /// length]`, the row length a multiple of the block size; no
            /// scale group crosses a row, so a step on any cut of the rows
            /// gives the bits of one optimizer over the whole parameter), or
            /// flat for `None`. An error, and no change, with rank-1
            /// normalization or `first_row >= global_rows`.
            pub fn set_row_layout(&mut self, rows: Option<RowLayout>) -> Result<()> {
                self.core.set_row_layout(rows)
            }

            /// [`Optimizer::update`] on a slice with an optional name (the
            /// state key is `"n:<name>"`; the Python binding's form).
            pub fn update_param(&mut self, param: ParamMut<'_>, grad: &[f32]) -> Result<()> {
                self.core.update(param, grad)
            }

            /// [`Optimizer::accumulate_grad`] on a slice; returns the key
            /// that [`Self::apply_accumulated_params`] matches.
            pub fn accumulate_param(
                &mut self,
                param: ParamRef<'_>,
                grad: &[f32],
            ) -> Result<String> {
                self.core.accumulate_grad(param, grad)
            }

            /// [`Optimizer::apply_accumulated_grads`] on slices given with
            /// the keys [`Self::accumulate_param`] returned.
            pub fn apply_accumulated_params(
                &mut self,
                accumulation_steps: usize,
                params: &mut [(String, ParamMut<'_>)],
            ) -> Result<()> {
                self.core
                    .apply_accumulated_grads(accumulation_steps, params)
            }
        }

        impl Optimizer for $name {
            fn update(
                &mut self,
                parameter: ArrayViewMutD<'_, f32>,
                grad: ArrayViewD<'_, f32>,
            ) -> Result<()> {
                array_api::update(&mut self.core, parameter, grad)
            }
            fn zero_grad(&mut self) {
                self.core.zero_grad()
            }
            fn step(&mut self) {
                self.core.step()
            }
            fn get_lr(&self) -> f32 {
                self.core.get_lr()
            }
            fn set_lr(&mut self, lr: f32) {
                self.core.set_lr_unchecked(lr)
            }
            fn try_set_lr(&mut self, lr: f32) -> Result<()> {
                self.core.set_lr(lr)
            }
            fn accumulate_grad(
                &mut self,
                parameter: ArrayViewMutD<'_, f32>,
                grad: ArrayViewD<'_, f32>,
            ) -> Result<()> {
                array_api::accumulate_grad(&mut self.core, parameter, grad)
            }
            fn apply_accumulated_grads(
                &mut self,
                accumulation_steps: usize,
                parameters: &mut [ArrayViewMutD<'_, f32>],
            ) -> Result<()> {
                array_api::apply_accumulated_grads(&mut self.core, accumulation_steps, parameters)
            }
        }

        impl StatefulOptimizer for $name {
            type Config = Adam4bitConfig;
            type State = OptimizerState;
            fn config(&self) -> &Adam4bitConfig {
                self.core.config()
            }
            fn state(&self) -> &OptimizerState {
                self.core.state()
            }
            fn state_dict(&self) -> Result<Tensors> {
                checkpoint::to_tensors(&self.core)
            }
            fn load_state_dict(&mut self, state: Tensors) -> Result<()> {
                checkpoint::load_tensors(&mut self.core, state)
            }
            fn memory_usage(&self) -> StateMemoryStats {
                self.core.memory_usage()
            }
            fn reset_state(&mut self) {
                self.core.reset_state()
            }
            fn num_parameters(&self) -> usize {
                self.core.num_parameters()
            }
            fn save_state(&self, path: &std::path::Path) -> Result<()> {
                checkpoint::save(&self.core, path)
            }
            fn load_state(&mut self, path: &std::path::Path) -> Result<()> {
                checkpoint::load(&mut self.core, path)
            }
        }
    };
}

optimizer_type!(
    Adam4bit,
    false,
    "4-bit Adam: L2 weight decay folded into the gradient (`g += wd * w`)."
);
optimizer_type!(
    AdamW4bit,
    true,
    "4-bit AdamW: Adam4bit with decoupled weight decay (`w -= lr * wd * w`, \
     from the weight before the step, as PyTorch's AdamW).

```
use ndarray::array;
use quantrs::{AdamW4bit, Optimizer, StatefulOptimizer};

let mut opt = AdamW4bit::new(0.1, 0.9, 0.999, 1e-8, 0.5);
let mut w = array![10.0f32];
let g = array![0.0f32];
opt.update(w.view_mut().into_dyn(), g.view().into_dyn())?;
opt.step();
assert_eq!(w[0], 9.5); // g = 0: only the decay, 10 - 0.1 * 0.5 * 10
assert_eq!(opt.num_parameters(), 1);
# Ok::<(), quantrs::QuantError>(())
```"
);
