//! `x` quantized to int8 blocks for the int8-activation path (`a8.rs`):
//! one scale per block of the weight's block size, code sums per
//! sub-block (ggml's Q8_0 / Q8_K idea), the same rounding as INT4's
//! `activations="int8"` (docs/formats.md, "Int8 activations").

use super::GgmlType;
use crate::error::{QuantError, Result};

/// Largest |xq|: symmetric, so `|q| * |xq|` pairs stay within `vpmaddubsw`'s
/// int16 (`2 * 128 * 127 < 32768`).
const XQ_MAX: f32 = 127.0;

/// Rows of `x` quantized per block of `elems` inputs.
#[derive(Clone, Debug)]
pub(crate) struct Xq {
    /// Codes `[rows, in]`.
    pub(super) q: Vec<i8>,
    /// Scales `[rows, in / elems]`.
    pub(super) d: Vec<f32>,
    /// Code sums per `sub` inputs, `[rows, in / sub]`.
    pub(super) sums: Vec<i32>,
    pub(super) in_feat: usize,
    pub(super) elems: usize,
    pub(super) sub: usize,
}

/// One row of an [`Xq`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct XqRow<'a> {
    pub(crate) q: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) sums: &'a [i32],
}

impl Xq {
    /// `x` `[rows, in_feat]` (`in_feat` a multiple of `T::ELEMS`) quantized
    /// per block of `T::ELEMS`: `d = absmax / 127` (f32 division),
    /// `xq = clamp(round_half_even(x / d), -127, 127)` (true division, as
    /// INT4's `activations="int8"`), a block with a subnormal `d` stored
    /// as `d = 0`, `xq = 0`. A NaN or infinity is an error (it has no code).
    pub(crate) fn quantize<T: GgmlType>(x: &[f32], rows: usize, in_feat: usize) -> Result<Xq> {
        debug_assert!(x.len() == rows * in_feat && in_feat.is_multiple_of(T::ELEMS));
        if x.iter().any(|v| !v.is_finite()) {
            return Err(QuantError::non_finite_activation(x, in_feat));
        }
        let mut q = vec![0i8; x.len()];
        let mut d = vec![0f32; x.len() / T::ELEMS];
        for ((xb, qb), db) in x
            .chunks_exact(T::ELEMS)
            .zip(q.chunks_exact_mut(T::ELEMS))
            .zip(d.iter_mut())
        {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = amax / XQ_MAX;
            if s < f32::MIN_POSITIVE {
                continue;
            }
            *db = s;
            for (c, &v) in qb.iter_mut().zip(xb) {
                *c = (v / s).round_ties_even().clamp(-XQ_MAX, XQ_MAX) as i8;
            }
        }
        let sums = q
            .chunks_exact(T::SUB)
            .map(|c| c.iter().map(|&v| i32::from(v)).sum())
            .collect();
        Ok(Xq {
            q,
            d,
            sums,
            in_feat,
            elems: T::ELEMS,
            sub: T::SUB,
        })
    }

    /// Batch row `b`.
    pub(crate) fn row(&self, b: usize) -> XqRow<'_> {
        let (nb, ns) = (self.in_feat / self.elems, self.in_feat / self.sub);
        XqRow {
            q: &self.q[b * self.in_feat..(b + 1) * self.in_feat],
            d: &self.d[b * nb..(b + 1) * nb],
            sums: &self.sums[b * ns..(b + 1) * ns],
        }
    }
}
