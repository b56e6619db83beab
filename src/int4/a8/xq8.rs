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
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;

/// The token of the AVX2 build of the quantizer (a unit type elsewhere).
#[cfg(target_arch = "x86_64")]
pub(crate) type Fast = Avx2;
/// The token of the AVX2 build of the quantizer (a unit type elsewhere).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type Fast = ();

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
    ///
    /// With `fast` the same code runs compiled for AVX2 (8 lanes); the
    /// operations, and so the codes, are the same.
    pub(crate) fn quantize(
        x: &[f32],
        rows: usize,
        in_feat: usize,
        pitch: usize,
        group_size: usize,
        fast: Option<Fast>,
    ) -> Result<Xq8> {
        debug_assert!(x.len() == rows * in_feat && pitch >= in_feat);
        debug_assert!(group_size > 0 && pitch.is_multiple_of(group_size));
        // One vectorizable pass (exponent all ones: inf or NaN); the index
        // only on the error path.
        let exp = 0x7F80_0000u32;
        if x.iter()
            .fold(false, |bad, v| bad | (v.to_bits() & exp == exp))
        {
            return Err(QuantError::non_finite_activation(x, in_feat));
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = fast {
            // SAFETY: the token proves AVX2 and FMA.
            return Ok(unsafe { quantize_avx2(t, x, rows, in_feat, pitch, group_size) });
        }
        let _ = fast;
        Ok(quantize_rows(x, rows, in_feat, pitch, group_size))
    }

    /// Codes of row `r`.
    pub(crate) fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.pitch..(r + 1) * self.pitch]
    }
}

/// [`quantize_rows`] compiled for AVX2.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(
    _: Avx2,
    x: &[f32],
    rows: usize,
    in_feat: usize,
    pitch: usize,
    group_size: usize,
) -> Xq8 {
    quantize_rows(x, rows, in_feat, pitch, group_size)
}

/// Every row of finite `x`, group by group.
#[inline(always)]
fn quantize_rows(x: &[f32], rows: usize, in_feat: usize, pitch: usize, group_size: usize) -> Xq8 {
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
    out
}

/// `1.5 * 2^23`: for `|t| <= 127`, `t + ROUNDER` lies in `[2^23, 2^24)`,
/// where the f32 spacing is 1, so the addition rounds `t` to an integer,
/// ties to even (the default rounding mode), and that integer is the
/// difference of the bit patterns. Plain operations the compiler
/// vectorizes: `f32::round_ties_even` is a library call on baseline x86_64
/// and the saturating `as i32` a branch per element, which made quantizing
/// `x` cost as much as the matvec.
const ROUNDER: f32 = 12_582_912.0;

/// One group: its scale and the sum of its codes (finite input).
#[inline(always)]
fn quantize_group(xs: &[f32], qs: &mut [i8]) -> (f32, i32) {
    // The largest |x| by its bits: for non-negative finite floats the
    // integer order is the float order (an integer max vectorizes, a float
    // max fold does not, lacking a NaN-free guarantee).
    let amax_bits = xs
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
    let d = f32::from_bits(amax_bits) / Q_MAX;
    if d < f32::MIN_POSITIVE {
        qs.fill(0);
        return (0.0, 0);
    }
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        // |v / d| <= 127 up to the division's rounding; the clamp keeps a
        // quotient a hair above it at 127.
        let t = (v / d).clamp(-Q_MAX, Q_MAX);
        let c = (t + ROUNDER).to_bits() as i32 - ROUNDER.to_bits() as i32;
        *q = c as i8;
        sum += c;
    }
    (d, sum)
}
