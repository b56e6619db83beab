//! `x` quantized to int8 blocks for the int8-activation path (`a8.rs`):
//! one scale per block of the weight's block size, code sums per
//! sub-block (ggml's Q8_0 / Q8_K idea), the same rounding as INT4's
//! `activations="int8"` (docs/formats.md, "Int8 activations").

use super::GgmlType;
use crate::error::{QuantError, Result};
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;

/// Largest |xq|: symmetric, so `|q| * |xq|` pairs stay within `vpmaddubsw`'s
/// int16 (`2 * 128 * 127 < 32768`).
const XQ_MAX: f32 = 127.0;

/// `1.5 * 2^23`: for `|t| <= 127`, `t + ROUNDER` lies in `[2^23, 2^24)`,
/// where the f32 spacing is 1, so the sum is `t` rounded to an integer,
/// ties to even (the default rounding mode), and that integer is the
/// difference of the bit patterns: `round_ties_even` in plain operations
/// that vectorize (the library call `rintf` does not, and quantizing `x`
/// per call cost as much as a small matvec).
const ROUNDER: f32 = 12_582_912.0;

/// Blocks of `elems` finite inputs of `x` into codes `q` and scales `d`
/// (`Xq::quantize`'s formula); blocks with a subnormal scale are left
/// zero. `amax` by the bits: for non-negative finite floats the integer
/// order is the float order, and an integer max vectorizes.
#[inline(always)]
pub(super) fn quantize_blocks(x: &[f32], elems: usize, q: &mut [i8], d: &mut [f32]) {
    for ((xb, qb), db) in x
        .chunks_exact(elems)
        .zip(q.chunks_exact_mut(elems))
        .zip(d.iter_mut())
    {
        let amax = xb
            .iter()
            .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
        let s = f32::from_bits(amax) / XQ_MAX;
        if s < f32::MIN_POSITIVE {
            continue;
        }
        *db = s;
        for (c, &v) in qb.iter_mut().zip(xb) {
            // Clamping before rounding gives the same code as after: a
            // quotient a hair above 127 rounds to 127 either way.
            let t = (v / s).clamp(-XQ_MAX, XQ_MAX);
            *c = ((t + ROUNDER).to_bits() as i32 - ROUNDER.to_bits() as i32) as i8;
        }
    }
}

/// [`quantize_blocks`] compiled for AVX2 (the same IEEE operations, so
/// the same codes and scales, eight lanes at a time).
///
/// # Safety
/// The token proves AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_blocks_avx2(_: Avx2, x: &[f32], elems: usize, q: &mut [i8], d: &mut [f32]) {
    quantize_blocks(x, elems, q, d);
}

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
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = Avx2::new() {
            // SAFETY: the token proves AVX2.
            unsafe { quantize_blocks_avx2(t, x, T::ELEMS, &mut q, &mut d) };
        } else {
            quantize_blocks(x, T::ELEMS, &mut q, &mut d);
        }
        #[cfg(not(target_arch = "x86_64"))]
        quantize_blocks(x, T::ELEMS, &mut q, &mut d);
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
