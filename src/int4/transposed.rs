//! The transposed product of a packed INT4 weight, `dx = g . W^T` for
//! `W` `[in_feat, out_feat]` and `g` `[batch, out_feat]`: the input gradient
//! of a linear layer whose forward is `y = x . W` (docs/torch.md,
//! "Fine-tuning on quantized weights").
//!
//! In the input-major nibble layout a byte row `data[p * out ..]` holds
//! input rows `2p` and `2p + 1` for every output, so `dx[b, 2p]` and
//! `dx[b, 2p + 1]` are two dot products along one contiguous byte row: the
//! weight is decoded on the fly, one group of rows at a time, and never
//! materialized as f32. Groups run in parallel (rayon) and each dequantized
//! value is `code * scale`, the value `dequantize` gives, so the result is
//! the f32 product with the dequantized weight up to the order of the sums.

use rayon::prelude::*;

use super::QuantizedWeight;
use crate::error::{QuantError, Result};

/// Lanes of the partial sums: independent accumulators the compiler keeps
/// in one vector register.
const LANES: usize = 8;

/// `sum_o a[o] * code(b[o]) * s[o]` for the low (`hi == false`) or high
/// nibble of each byte, with `LANES` partial sums added at the end.
fn nibble_dot(a: &[f32], bytes: &[u8], s: &[f32], hi: bool) -> f32 {
    let code = |b: u8| -> f32 {
        if hi {
            ((b as i8) >> 4) as f32
        } else {
            (((b << 4) as i8) >> 4) as f32
        }
    };
    let mut acc = [0f32; LANES];
    let n = a.len() / LANES * LANES;
    for ((ac, bc), sc) in a[..n]
        .chunks_exact(LANES)
        .zip(bytes[..n].chunks_exact(LANES))
        .zip(s[..n].chunks_exact(LANES))
    {
        for l in 0..LANES {
            acc[l] += ac[l] * (code(bc[l]) * sc[l]);
        }
    }
    let mut tail = 0f32;
    for o in n..a.len() {
        tail += a[o] * (code(bytes[o]) * s[o]);
    }
    acc.iter().sum::<f32>() + tail
}

impl QuantizedWeight {
    /// `dx = g . W^T`: `g` `[batch, out_feat]`, `dx` `[batch, in_feat]` (the
    /// input gradient of `y = x . W`). A slice of the wrong length is an
    /// error and `dx` is untouched.
    pub fn try_matmul_transposed(&self, g: &[f32], batch: usize, dx: &mut [f32]) -> Result<()> {
        let (inf, outf) = (self.in_feat(), self.out_feat());
        let ng = batch.checked_mul(outf);
        if ng != Some(g.len()) {
            return Err(QuantError::dims(
                "grad_output",
                format!("[{batch}, {outf}]"),
                format!("{} elements", g.len()),
            ));
        }
        if batch.checked_mul(inf) != Some(dx.len()) {
            return Err(QuantError::dims(
                "dx",
                format!("[{batch}, {inf}]"),
                format!("{} elements", dx.len()),
            ));
        }
        if batch == 0 {
            return Ok(());
        }
        let gs = self.group_size();
        let data = self.data();
        let scales = self.scales();
        // One group of input rows per task: dx[:, rows of the group] for every
        // row of the batch, `[batch, gs]`, scattered into dx afterwards.
        let blocks: Vec<Vec<f32>> = (0..self.num_groups())
            .into_par_iter()
            .map(|gi| {
                let s = &scales[gi * outf..(gi + 1) * outf];
                let mut blk = vec![0f32; batch * gs];
                for pl in 0..gs / 2 {
                    let p = gi * gs / 2 + pl;
                    let bytes = &data[p * outf..(p + 1) * outf];
                    for b in 0..batch {
                        let gr = &g[b * outf..(b + 1) * outf];
                        blk[b * gs + 2 * pl] = nibble_dot(gr, bytes, s, false);
                        blk[b * gs + 2 * pl + 1] = nibble_dot(gr, bytes, s, true);
                    }
                }
                blk
            })
            .collect();
        for (gi, blk) in blocks.iter().enumerate() {
            let r0 = gi * gs;
            let w = gs.min(inf - r0);
            for b in 0..batch {
                dx[b * inf + r0..b * inf + r0 + w].copy_from_slice(&blk[b * gs..b * gs + w]);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::assert_transposed_product;

    /// Against the f64 product with the dequantized weight.
    #[test]
    fn matches_the_dequantized_product() {
        for (inf, outf, gs, batch) in [
            (7, 5, 2, 3),
            (64, 33, 32, 2),
            (100, 17, 128, 1),
            (6, 9, 4, 0),
        ] {
            let w: Vec<f32> = (0..inf * outf)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
                .collect();
            let q = QuantizedWeight::quantize_grouped(&w, inf, outf, gs).unwrap();
            let deq = q.dequantize();
            let g: Vec<f32> = (0..batch * outf)
                .map(|i| ((i * 13 % 17) as f32 - 8.0) / 3.0)
                .collect();
            let mut dx = vec![f32::NAN; batch * inf];
            q.try_matmul_transposed(&g, batch, &mut dx).unwrap();
            let w_at = |o: usize, i: usize| deq[i * outf + o];
            assert_transposed_product(&g, w_at, &dx, batch, outf, inf, &format!("g{gs}"));
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let q = QuantizedWeight::quantize(&[0.5; 8 * 3], 8, 3);
        let mut dx = vec![1.0; 8];
        assert!(q.try_matmul_transposed(&[0.0; 4], 1, &mut dx).is_err());
        assert!(q.try_matmul_transposed(&[0.0; 3], 1, &mut dx[..7]).is_err());
        assert_eq!(dx, vec![1.0; 8]);
    }
}
