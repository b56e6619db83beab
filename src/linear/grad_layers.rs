//! `grad_input` of the layers: `QuantLinear<F>` through the format's
//! `WeightFormat::matmul_transposed`, `PerTensorFP8Linear` through the
//! output-row engine of `grad_input` (docs/torch.md, "Fine-tuning on
//! quantized weights").

use super::grad_input::grad_input_rows;
use crate::error::{QuantError, Result};

impl<F: crate::format::WeightFormat> super::QuantLinear<F> {
    /// The input gradient `dx = g . W` of `forward` for `g` `[rows, out]`:
    /// `[rows, in]`, through the format's transposed kernel (the bias has
    /// no part in it; the weight is frozen and gets no gradient).
    pub fn grad_input(&self, g: &[f32], rows: usize) -> Result<Vec<f32>> {
        let w = self.quantized_weight();
        let [_, in_feat] = F::shape(w);
        let n = rows
            .checked_mul(in_feat)
            .ok_or_else(|| QuantError::arg(format!("rows: {rows} x {in_feat} overflows")))?;
        let mut dx = vec![0f32; n];
        F::matmul_transposed(w, g, rows, &mut dx)?;
        Ok(dx)
    }
}

impl super::PerTensorFP8Linear {
    /// The input gradient `dx = g . (decode(codes) * weight_scale_inv)` for
    /// `g` `[rows, out]`: `[rows, in]`. The same with or without an
    /// activation scale: W8A8's activation rounding is treated as the
    /// identity (the straight-through estimator). A 2-D weight only.
    pub fn grad_input(&self, g: &[f32], rows: usize) -> Result<Vec<f32>> {
        let &[out_feat, in_feat] = self.shape() else {
            return Err(QuantError::UnsupportedOperation(format!(
                "grad_input: expected a 2-D weight [out, in], got shape {:?}",
                self.shape()
            )));
        };
        let n = rows
            .checked_mul(in_feat)
            .ok_or_else(|| QuantError::arg(format!("rows: {rows} x {in_feat} overflows")))?;
        let mut dx = vec![0f32; n];
        let src = crate::format::E4m3Rows {
            codes: self.weight(),
            k: in_feat,
        };
        let s = self.weight_scale_inv();
        grad_input_rows(&src, [out_feat, in_feat], &|_| s, g, rows, &mut dx)?;
        Ok(dx)
    }
}

#[cfg(test)]
mod tests {
    use crate::format::{Float32, Fp8E4M3, Int4, Int8, WeightFormat};
    use crate::testutil::assert_transposed_product;

    /// `F::matmul_transposed` against the f64 product with `F::dequantize`,
    /// within the f32 summation bound `out * 2^-23 * sum |g w|`.
    fn check<F: WeightFormat>(params: F::Params, out_feat: usize, in_feat: usize, rows: usize) {
        let w: Vec<f32> = (0..out_feat * in_feat)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 9.0)
            .collect();
        let q = F::quantize(&w, out_feat, in_feat, params).unwrap();
        let deq = F::dequantize(&q);
        let g: Vec<f32> = (0..rows * out_feat)
            .map(|i| ((i * 11 % 19) as f32 - 9.0) / 4.0)
            .collect();
        let mut dx = vec![f32::NAN; rows * in_feat];
        F::matmul_transposed(&q, &g, rows, &mut dx).unwrap();
        let w_at = |o: usize, i: usize| deq[o * in_feat + i];
        assert_transposed_product(&g, w_at, &dx, rows, out_feat, in_feat, F::INFO.name);
        let mut short = vec![0f32; rows * in_feat + 1];
        assert!(F::matmul_transposed(&q, &g, rows, &mut short).is_err());
    }

    #[test]
    fn every_format_matches_its_dequantized_weight() {
        for (o, i, r) in [(5, 7, 3), (40, 300, 2), (3, 600, 1)] {
            check::<Float32>((), o, i, r);
            check::<Int8>((), o, i, r);
            check::<Fp8E4M3>((), o, i, r);
            check::<Int4>(32, o, i, r);
            check::<Int4>(2, o, i, r);
        }
    }
}
