//! `UnquantLinear`: a plain float32 linear, `y = x . W^T + bias`, the
//! `apply_isq(None)` target: [`QuantLinear`] over [`Float32`].

use super::quant_linear::QuantLinear;
use crate::error::Result;
use crate::format::{Float32, FloatWeight};

/// Float32 linear layer, weight `[out, in]`.
pub type UnquantLinear = QuantLinear<Float32>;

impl QuantLinear<Float32> {
    /// Validated: finite weight of `out * in` elements, bias `[out]`.
    pub fn new(
        weight: Vec<f32>,
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        Self::from_weight(FloatWeight::new(weight, out_feat, in_feat)?, bias)
    }

    /// The f32 weight `[out, in]`.
    pub fn weight(&self) -> &[f32] {
        self.quantized_weight().values()
    }
}
