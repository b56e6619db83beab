//! Round-to-nearest quantization into `int_zp` (what `apply_isq` and
//! `QuantLinear` use): per group, the step `s = (max - min) / (2^bits - 1)`
//! rounded to half, the zero point `z = round(-min / s)` clamped to the
//! code range, and `q = clamp(round(w / s) + z)`: GPTQ's min / max grid
//! (its `Quantizer.find_params` with `sym=False`) without the error
//! feedback. Checkpoints keep their producer's codes; this is for weights
//! quantized here.

use rayon::prelude::*;

use super::{groups_of, half, ZpParts, ZpWeight};
use crate::error::{QuantError, Result};
use crate::ggml::f32_to_f16;

/// Quantize a finite float weight `[out, in]` with `bits`-bit codes in
/// groups of `group_size` inputs.
pub fn quantize_rtn(
    w: &[f32],
    out_feat: usize,
    in_feat: usize,
    group_size: usize,
    bits: u32,
) -> Result<ZpWeight> {
    let groups = groups_of(out_feat, in_feat, group_size, bits)?;
    // (`crate::format::check_float_weight` says the same; importing it would
    // make format -> int_zp -> format a ring.)
    if Some(w.len()) != out_feat.checked_mul(in_feat) {
        return Err(QuantError::dims(
            "weight length",
            out_feat * in_feat,
            w.len(),
        ));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::arg(format!(
            "weight[{i}] is not finite ({})",
            w[i]
        )));
    }
    let top = ((1u32 << bits) - 1) as f32;
    let mut q = vec![0u8; w.len()];
    let mut scales = vec![0u16; out_feat * groups];
    let mut zeros = vec![0u8; out_feat * groups];
    q.par_chunks_mut(in_feat)
        .zip(w.par_chunks(in_feat))
        .zip(
            scales
                .par_chunks_mut(groups)
                .zip(zeros.par_chunks_mut(groups)),
        )
        .for_each(|((qr, wr), (sr, zr))| {
            let chunks = qr.chunks_mut(group_size).zip(wr.chunks(group_size));
            for ((qg, wg), (s, z)) in chunks.zip(sr.iter_mut().zip(zr.iter_mut())) {
                let lo = wg.iter().fold(0f32, |a, &v| a.min(v));
                let hi = wg.iter().fold(0f32, |a, &v| a.max(v));
                *s = f32_to_f16((hi - lo) / top);
                let step = half(*s);
                if step == 0.0 {
                    // An all-zero group: any zero point, codes equal to it.
                    *s = 0;
                    *z = 0;
                    qg.fill(0);
                    continue;
                }
                let zero = (-lo / step).round().clamp(0.0, top);
                *z = zero as u8;
                for (c, &v) in qg.iter_mut().zip(wg) {
                    *c = ((v / step).round() + zero).clamp(0.0, top) as u8;
                }
            }
        });
    // A group beyond the half range rounds s to infinity: refused by the
    // constructor, naming the group.
    let parts = ZpParts {
        scales,
        zeros,
        perm: None,
        shape: [out_feat, in_feat],
        group_size,
        bits,
    };
    ZpWeight::from_codes(&q, parts)
}
