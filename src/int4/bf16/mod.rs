//! `Y = X W` with the activations as bfloat16, for prefill-sized batches
//! on the AMX tile unit (docs/int4.md, "How matmul works").
//!
//! The activations are one to three planes of bf16 values whose sum is
//! `x` exactly: a bfloat16 input is its own single plane, read in place
//! where its rows need no padding; a float32 input is split into
//! `x = x1 + x2 + x3` (`x1 = bf16(x)`, `x2 = bf16(x - x1)`, `x3` the rest,
//! which has at most 8 significant bits), and only as many planes run as
//! some element needs. INT4 codes (-8 .. 7) are exact in bf16 and the
//! product of two bf16 values is exact in f32, so per group the tile unit
//! forms `acc = sum_i q_i * x_i` with exact products and f32 additions in
//! its own order; the epilogue then applies the group's scale in f32,
//! `y = y + acc * s_g` group by group from `y = 0`, as the scalar twin
//! ([`matmul_scalar`]) does. The two differ only in the order of the f32
//! additions inside a group (and the tile unit reads bf16 subnormals as
//! zero), a difference below `gs * 2^-23 * sum_g |s_g| sum_i |q_i x_i|`,
//! the bound the tests check against float64.
//!
//! Results do not depend on the thread count: each output is summed by one
//! task over its groups in order.

#[cfg(target_arch = "x86_64")]
mod amx;
mod planes;
#[cfg(test)]
mod tests;

use super::QuantizedWeightRef;
#[cfg(target_arch = "x86_64")]
use crate::simd::Amx;
pub(crate) use planes::Planes;

/// Smallest batch sent to the tile GEMM: one whole 16-row tile.
pub(crate) const MIN_BATCH: usize = 16;

/// Where the results go: float32 rows, or bfloat16 rows (each value, bias
/// added in f32, rounded once to nearest even).
pub(crate) enum Out<'a> {
    F32(&'a mut [f32]),
    Bf16 {
        y: &'a mut [u16],
        bias: Option<&'a [f32]>,
    },
}

impl Out<'_> {
    fn len(&self) -> usize {
        match self {
            Out::F32(y) => y.len(),
            Out::Bf16 { y, .. } => y.len(),
        }
    }
}

/// Whether the tile GEMM takes weights of `group_size`: whole 32-input
/// tile steps per group.
pub(crate) fn eligible(group_size: usize) -> bool {
    group_size.is_multiple_of(32)
}

/// `bf16(v)` rounded to nearest even, as bits (finite `v`; a NaN stays a
/// NaN).
pub(crate) fn bf16_rne(v: f32) -> u16 {
    if v.is_nan() {
        return 0x7FC0 | (v.to_bits() >> 16) as u16 & 0x8000;
    }
    let b = v.to_bits();
    (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// The value of bf16 bits `h`.
pub(crate) fn bf16_value(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// The tile GEMM's token, where the CPU and the weights allow it.
#[cfg(target_arch = "x86_64")]
pub(crate) fn tiles_for(group_size: usize) -> Option<Amx> {
    if eligible(group_size) {
        Amx::new()
    } else {
        None
    }
}

/// `out = x @ W` (plus the bias for a bf16 output) through the tile GEMM.
/// Sizes are the caller's to check: `x` has `qw.in_feat` inputs per row,
/// `out` `x.rows() * qw.out_feat` values.
#[cfg(target_arch = "x86_64")]
pub(crate) fn matmul_tiles(tok: Amx, qw: &QuantizedWeightRef, x: &Planes, out: Out) {
    assert!(eligible(qw.group_size()));
    assert_eq!(out.len(), x.rows() * qw.out_feat);
    amx::gemm(tok, qw, x, out);
}

/// The scalar twin: per row, per group, `acc = sum_i q_i * x_i` over the
/// planes in input order (exact products, f32 sums), then
/// `y = y + acc * s_g` from `y = 0`. The reference the tile GEMM is
/// tested against (kept with the tests).
#[cfg(test)]
pub(crate) fn matmul_scalar(qw: &QuantizedWeightRef, x: &Planes, mut out: Out) {
    let (n, gs) = (qw.out_feat, qw.group_size());
    assert_eq!(out.len(), x.rows() * n);
    let mut y = vec![0f32; n];
    let mut acc = vec![0f32; n];
    for r in 0..x.rows() {
        y.fill(0.0);
        for g in 0..qw.num_groups {
            acc.fill(0.0);
            for i in g * gs..((g + 1) * gs).min(qw.in_feat) {
                let row = &qw.data[i / 2 * n..][..n];
                for p in 0..x.parts() {
                    let xv = bf16_value(x.at(p, r, i));
                    for (a, &b) in acc.iter_mut().zip(row) {
                        let q = if i % 2 == 0 {
                            ((b << 4) as i8) >> 4
                        } else {
                            (b as i8) >> 4
                        };
                        *a += f32::from(q) * xv;
                    }
                }
            }
            let s = &qw.scales[g * n..][..n];
            for ((yv, a), sv) in y.iter_mut().zip(&acc).zip(s) {
                *yv += a * sv;
            }
        }
        match &mut out {
            Out::F32(o) => o[r * n..][..n].copy_from_slice(&y),
            Out::Bf16 { y: o, bias } => {
                for (c, (ov, yv)) in o[r * n..][..n].iter_mut().zip(&y).enumerate() {
                    *ov = bf16_rne(yv + bias.map_or(0.0, |b| b[c]));
                }
            }
        }
    }
}

/// Largest bf16 exponent (biased) the tile GEMM takes in `x`: products and
/// sums then stay far inside f32's range without the range scaling of the
/// float32 path (`crate::range`), which calls with larger values, infinities
/// or NaN go through instead.
const TAME_EXPONENT: u16 = 127 + 100;

impl QuantizedWeightRef<'_> {
    /// `y = x @ W + bias` for bfloat16 `x` `[batch, in_feat]` (as bits)
    /// into bfloat16 `y` `[batch, out_feat]`, the bias (float32) added
    /// before the one rounding of each output. From 16 rows on
    /// CPUs with AMX-BF16 the tile GEMM reads `x` as it is (see the module
    /// docs); elsewhere, and for inputs beyond 2^100 in magnitude, `x` is
    /// widened to float32 and runs the float32 kernels. A slice of the
    /// wrong length is an error and `y` is untouched.
    pub fn matmul_bf16(
        &self,
        x: &[u16],
        batch: usize,
        bias: Option<&[f32]>,
        y: &mut [u16],
    ) -> crate::error::Result<()> {
        let (k, n) = (self.in_feat, self.out_feat);
        if batch.checked_mul(k) != Some(x.len()) || batch.checked_mul(n) != Some(y.len()) {
            return Err(crate::error::QuantError::dims(
                "x/y",
                format!("[{batch}, {k}] / [{batch}, {n}]"),
                format!("{} / {} elements", x.len(), y.len()),
            ));
        }
        if let Some(b) = bias {
            if b.len() != n {
                return Err(crate::error::QuantError::dims(
                    "bias",
                    format!("[{n}]"),
                    b.len(),
                ));
            }
        }
        #[cfg(target_arch = "x86_64")]
        if batch >= MIN_BATCH {
            if let Some(tok) = tiles_for(self.group_size()) {
                if x.iter().all(|&h| (h >> 7) & 0xFF <= TAME_EXPONENT) {
                    let planes = Planes::bf16(x, batch, k, self.in_padded());
                    matmul_tiles(tok, self, &planes, Out::Bf16 { y, bias });
                    return Ok(());
                }
            }
        }
        let xf: Vec<f32> = x.iter().map(|&h| bf16_value(h)).collect();
        let mut yf = vec![0f32; y.len()];
        self.try_matmul(&xf, batch, &mut yf)?;
        for (row_y, row_f) in y.chunks_exact_mut(n).zip(yf.chunks_exact(n)) {
            for (c, (o, v)) in row_y.iter_mut().zip(row_f).enumerate() {
                *o = bf16_rne(v + bias.map_or(0.0, |b| b[c]));
            }
        }
        Ok(())
    }
}
