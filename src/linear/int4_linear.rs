//! `Int4Linear`: [`QuantLinear`] over [`Int4`], packed INT4 weights in a
//! [`QuantizedWeight`] (groups along the input dimension; it stores
//! `[in, out]`, the transpose of the linear's `[out, in]`).
//!
//! Scales: absmax by default, or importance-weighted with an imatrix
//! (`crate::format::weighted_group_scale` describes the search).

use super::quant_linear::QuantLinear;
use crate::error::Result;
use crate::format::{check_float_weight, quantize_int4_weighted, Int4};
use crate::int4::QuantizedWeight;

/// INT4 linear layer.
pub type Int4Linear = QuantLinear<Int4>;

impl QuantLinear<Int4> {
    /// Wrap a packed weight (`[in, out]` as `QuantizedWeight` stores it).
    pub fn new(qw: QuantizedWeight, bias: Option<Vec<f32>>) -> Result<Self> {
        Self::from_weight(qw, bias)
    }

    /// Quantize a float weight `[out, in]`, groups of `group_size` along
    /// `in`; scales by absmax, or importance-weighted with `imatrix` `[in]`.
    pub fn from_float(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
        bias: Option<Vec<f32>>,
        imatrix: Option<&[f32]>,
    ) -> Result<Self> {
        match imatrix {
            None => Self::quantize(w, out_feat, in_feat, group_size, bias),
            Some(a) => {
                check_float_weight(w, &[out_feat, in_feat])?;
                let qw = quantize_int4_weighted(w, out_feat, in_feat, group_size, a)?;
                Self::from_weight(qw, bias)
            }
        }
    }

    /// The packed INT4 weight (`[in, out]`, see `crate::int4`).
    pub fn qweight(&self) -> &QuantizedWeight {
        self.quantized_weight()
    }
}
