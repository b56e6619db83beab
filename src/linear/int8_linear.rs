//! `Int8Linear`: [`QuantLinear`] over [`Int8`] (int8 codes `[out, in]`, one
//! absmax scale per output row; `crate::format` has the formulas).

use super::quant_linear::QuantLinear;
use crate::error::Result;
use crate::format::{Int8, Int8Weight};

/// int8 per-output-row linear layer.
pub type Int8Linear = QuantLinear<Int8>;

impl QuantLinear<Int8> {
    /// From raw codes `[out, in]` and scales `[out]` (finite, > 0).
    pub fn new(
        q: Vec<i8>,
        scales: Vec<f32>,
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        Self::from_weight(Int8Weight::new(q, scales, out_feat, in_feat)?, bias)
    }

    /// Quantize a float weight `[out, in]` per output row.
    pub fn from_float(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        Self::quantize(w, out_feat, in_feat, (), bias)
    }

    /// The int8 codes `[out, in]`.
    pub fn q(&self) -> &[i8] {
        self.quantized_weight().q()
    }

    /// The per-output-row scales `[out]`.
    pub fn scales(&self) -> &[f32] {
        self.quantized_weight().scales()
    }
}
