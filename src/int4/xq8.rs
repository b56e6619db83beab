//! `x` quantized to int8 per group of the weight's input rows, for the
//! `activations = "int8"` matvec (docs/int4.md, "Int8 activations").
//!
//! The scheme is ggml's Q8_0 idea (one scale per block of inputs, absmax /
//! 127, symmetric), with the block being the weight's scale group so that
//! one integer dot product per group and column meets exactly one weight
//! scale and one activation scale:
//! - `d[g] = absmax(x[rows of g]) / 127` (f32 division);
//! - `q[i] = clamp(round_half_even(x[i] / d[g]), -127, 127)` (true
//!   division, so NumPy's `np.rint(x / d)` reproduces it bit for bit);
//! - a group whose `d` would be subnormal (absmax below `127 * 2^-126`)
//!   is stored as `d = 0`, `q = 0`: a subnormal `d` carries too few bits
//!   for the `|x - q d| <= d / 2` bound, and such groups add less than
//!   `1.5e-36 * sum |w|` to any output.

use crate::error::{QuantError, Result};

/// Largest |q|: symmetric, so `-q` never overflows and the kernels'
/// products stay within `15 * 127`.
pub(crate) const Q_MAX: f32 = 127.0;

/// Rows of `x` in int8, zero-padded to `pitch` (= `in_padded`) each.
#[derive(Clone, Debug)]
pub(crate) struct Xq8 {
    /// Codes, `[rows * pitch]`.
    pub q: Vec<i8>,
    /// Scales, `[rows * num_groups]`.
    pub d: Vec<f32>,
    /// Per row and group, the sum of its codes (the AVX2 kernel offsets the
    /// weight nibbles by 8 and takes `8 * sum` back off).
    pub sums: Vec<i32>,
    /// Rows of `x`.
    pub rows: usize,
    /// Codes per row (`in_padded`).
    pub pitch: usize,
    /// Groups per row.
    pub num_groups: usize,
}

impl Xq8 {
    /// Quantize `x` `[rows, in_feat]` in groups of `group_size` (the last
    /// one zero-padded up to `pitch`). A NaN or infinity is an error: it
    /// has no int8 code (the float32 path propagates it instead).
    pub(crate) fn quantize(
        x: &[f32],
        rows: usize,
        in_feat: usize,
        pitch: usize,
        group_size: usize,
    ) -> Result<Xq8> {
        debug_assert!(x.len() == rows * in_feat && pitch >= in_feat);
        debug_assert!(group_size > 0 && pitch.is_multiple_of(group_size));
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::arg(format!(
                "x: non-finite value {} at index [{}, {}] cannot be quantized to int8 \
                 (activations='int8'; use activations='float32' to propagate it)",
                x[i],
                i / in_feat,
                i % in_feat
            )));
        }
        let num_groups = pitch / group_size;
        let mut out = Xq8 {
            q: vec![0; rows * pitch],
            d: vec![0.0; rows * num_groups],
            sums: vec![0; rows * num_groups],
            rows,
            pitch,
            num_groups,
        };
        let mut padded = vec![0.0f32; pitch];
        for r in 0..rows {
            padded[..in_feat].copy_from_slice(&x[r * in_feat..(r + 1) * in_feat]);
            let qrow = &mut out.q[r * pitch..(r + 1) * pitch];
            for (g, (xs, qs)) in padded
                .chunks_exact(group_size)
                .zip(qrow.chunks_exact_mut(group_size))
                .enumerate()
            {
                let (d, sum) = quantize_group(xs, qs);
                out.d[r * num_groups + g] = d;
                out.sums[r * num_groups + g] = sum;
            }
        }
        Ok(out)
    }

    /// Codes of row `r`.
    pub(crate) fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.pitch..(r + 1) * self.pitch]
    }
}

/// One group: its scale and the sum of its codes (finite input).
fn quantize_group(xs: &[f32], qs: &mut [i8]) -> (f32, i32) {
    let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / Q_MAX;
    if d < f32::MIN_POSITIVE {
        qs.fill(0);
        return (0.0, 0);
    }
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        // |v / d| <= 127 up to the division's rounding; the clamp keeps a
        // quotient a hair above it at 127.
        let c = (v / d).round_ties_even().clamp(-Q_MAX, Q_MAX) as i8;
        *q = c;
        sum += c as i32;
    }
    (d, sum)
}
