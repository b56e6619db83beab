//! Configuration of the 4-bit optimizers, validated at construction: every
//! field does something, and values outside its domain are rejected.

use super::codebook::VarianceMap;
use crate::error::{QuantError, Result};

/// Which code book stores the first moment m.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantizationMethod {
    /// NormalFloat4 (QLoRA), 4 bits.
    Nf4,
    /// Symmetric linear, 4 bits.
    Int4,
    /// Signed dynamic-exponent map, 4 bits.
    Dynamic,
    /// Signed 8-bit dynamic-tree map (one byte per element).
    Int8,
}

impl QuantizationMethod {
    /// Every method, in declaration order.
    pub const ALL: [QuantizationMethod; 4] = [
        QuantizationMethod::Nf4,
        QuantizationMethod::Int4,
        QuantizationMethod::Dynamic,
        QuantizationMethod::Int8,
    ];

    /// Parse a method name (`nf4`, `int4`, `dynamic`, `int8`; case-insensitive).
    pub fn parse(s: &str) -> Result<QuantizationMethod> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nf4" => Ok(QuantizationMethod::Nf4),
            "int4" => Ok(QuantizationMethod::Int4),
            "dynamic" => Ok(QuantizationMethod::Dynamic),
            "int8" => Ok(QuantizationMethod::Int8),
            _ => Err(QuantError::arg(format!(
                "method: expected one of 'nf4', 'int4', 'dynamic', 'int8', got {s:?}"
            ))),
        }
    }

    /// The name `parse` accepts and checkpoints store.
    pub fn name(self) -> &'static str {
        match self {
            QuantizationMethod::Nf4 => "nf4",
            QuantizationMethod::Int4 => "int4",
            QuantizationMethod::Dynamic => "dynamic",
            QuantizationMethod::Int8 => "int8",
        }
    }

    /// Bits per m element.
    pub fn m_bits(self) -> usize {
        if self == QuantizationMethod::Int8 {
            8
        } else {
            4
        }
    }
}

/// The Adam hyper-parameters (in the order the constructors take them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam4bitOptimizerConfig {
    /// Step size, finite and >= 0.
    pub learning_rate: f32,
    /// Decay of the first moment, in [0, 1).
    pub beta1: f32,
    /// Decay of the second moment, in [0, 1).
    pub beta2: f32,
    /// Added to the denominator, finite and > 0.
    pub epsilon: f32,
    /// Weight decay (L2 for Adam4bit, decoupled for AdamW4bit), finite and >= 0.
    pub weight_decay: f32,
}

impl Default for Adam4bitOptimizerConfig {
    fn default() -> Self {
        Adam4bitOptimizerConfig {
            learning_rate: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// A learning rate must be finite and non-negative.
pub fn check_lr(lr: f32) -> Result<()> {
    if !lr.is_finite() || lr < 0.0 {
        return Err(QuantError::arg(format!(
            "learning_rate: expected a finite value >= 0, got {lr}"
        )));
    }
    Ok(())
}

impl Adam4bitOptimizerConfig {
    /// Reject values outside each field's domain (the error names the field).
    pub fn validate(&self) -> Result<()> {
        check_lr(self.learning_rate)?;
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(QuantError::arg(format!(
                    "{name}: expected a value in [0, 1), got {b}"
                )));
            }
        }
        if !self.epsilon.is_finite() || self.epsilon <= 0.0 {
            return Err(QuantError::arg(format!(
                "epsilon: expected a finite value > 0, got {}",
                self.epsilon
            )));
        }
        if !self.weight_decay.is_finite() || self.weight_decay < 0.0 {
            return Err(QuantError::arg(format!(
                "weight_decay: expected a finite value >= 0, got {}",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// The only accepted `adaptation_rate` (see [`AdvancedQuantizationConfig`]).
pub const ADAPTATION_RATE: f32 = 0.01;

/// How the state is quantized.
///
/// `adaptation_rate` is kept so code written against the original config
/// compiles (docs/rust.md), but block scales are
/// recomputed from the block's absmax at every step, so there is nothing
/// to adapt: any value other than the default 0.01 is rejected rather than
/// silently ignored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdvancedQuantizationConfig {
    /// The code book of m.
    pub method: QuantizationMethod,
    /// Elements per block (one scale each), even, in [2, 65536].
    pub block_size: usize,
    /// Kept for compatibility; only the default 0.01 is accepted.
    pub adaptation_rate: f32,
    /// Lower clamp of a non-zero block scale, in gradient units (m's scale,
    /// and `sqrt` of v's scale); all-zero blocks keep scale 0.
    pub min_scale: f32,
    /// Upper clamp of a block scale, in gradient units; larger values
    /// saturate at the code book's ends.
    pub max_scale: f32,
    /// Store block scales as 8-bit log codes with a (max, min) f32 pair per
    /// 256 blocks instead of one f32 per block.
    pub double_quantization: bool,
    /// lpmm's rank-1 normalization of v for 2-D parameters.
    pub rank1_normalization: bool,
    /// The code book of v.
    pub variance_map: VarianceMap,
}

/// The default v map, chosen by the convergence suite
/// (docs/optim-convergence.md): with v's scales rounded without bias, the
/// log map's finer small codes (1e-2 of the block maximum against 1/16)
/// keep small v from being overestimated, and it tracks float32 on every
/// task where `sqrt_linear` ends up to 6 % above.
pub const DEFAULT_VARIANCE_MAP: VarianceMap = VarianceMap::SqrtLog;

impl Default for AdvancedQuantizationConfig {
    fn default() -> Self {
        AdvancedQuantizationConfig {
            method: QuantizationMethod::Nf4,
            block_size: 64,
            adaptation_rate: ADAPTATION_RATE,
            min_scale: 1e-8,
            max_scale: 1e8,
            double_quantization: true,
            rank1_normalization: false,
            variance_map: DEFAULT_VARIANCE_MAP,
        }
    }
}

/// Largest accepted block size (the kernels keep a group of 256 blocks in
/// a per-thread scratch buffer).
pub const MAX_BLOCK_SIZE: usize = 1 << 16;

impl AdvancedQuantizationConfig {
    /// Reject values outside each field's domain (the error names the field).
    pub fn validate(&self) -> Result<()> {
        if self.block_size == 0
            || !self.block_size.is_multiple_of(2)
            || self.block_size > MAX_BLOCK_SIZE
        {
            return Err(QuantError::arg(format!(
                "block_size: expected an even value in [2, {MAX_BLOCK_SIZE}], got {}",
                self.block_size
            )));
        }
        if self.adaptation_rate != ADAPTATION_RATE {
            return Err(QuantError::UnsupportedOperation(format!(
                "adaptation_rate: block scales are recomputed from each block's absmax at every \
                 step, so there is no rate to adapt; only the default {ADAPTATION_RATE} is \
                 accepted, got {}",
                self.adaptation_rate
            )));
        }
        let ok = |x: f32| x.is_finite() && x > 0.0;
        if !ok(self.min_scale) || !ok(self.max_scale) || self.min_scale > self.max_scale {
            return Err(QuantError::arg(format!(
                "min_scale/max_scale: expected finite 0 < min_scale <= max_scale, got {} and {}",
                self.min_scale, self.max_scale
            )));
        }
        // v's scale is clamped to [min^2, max^2] in the linear domain.
        let (lo, hi) = (
            self.min_scale * self.min_scale,
            self.max_scale * self.max_scale,
        );
        if lo < f32::MIN_POSITIVE || !hi.is_finite() {
            return Err(QuantError::arg(format!(
                "min_scale/max_scale: their squares must be normal f32 values (v's scale is \
                 clamped to [min_scale^2, max_scale^2]), got {} and {}",
                self.min_scale, self.max_scale
            )));
        }
        Ok(())
    }
}

/// Both halves of the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Adam4bitConfig {
    /// The Adam hyper-parameters.
    pub optimizer: Adam4bitOptimizerConfig,
    /// How the state is quantized.
    pub quantization: AdvancedQuantizationConfig,
}

impl Adam4bitConfig {
    /// Validate both halves.
    pub fn validate(&self) -> Result<()> {
        self.optimizer.validate()?;
        self.quantization.validate()
    }
}
