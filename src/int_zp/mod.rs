//! Zero-point INT weights, the layout of GPTQ and AWQ checkpoints: per
//! group of `group_size` inputs of one output row, unsigned codes `q` of
//! `bits` bits (4 or 8), an IEEE half scale `s` and an integer zero point
//! `z` (`0 ..= 2^bits - 1`), and
//!
//! `w = f32(s) * f32(q - z)`
//!
//! in float32: `q - z` is an exact small integer, so the value is the one
//! rounding of the product, what GPTQ's and AWQ's dequantizers compute
//! (`scales * (q - zeros)`, AutoGPTQ `QuantLinear`, AutoAWQ
//! `dequantize_gemm`) when run in float32. `s * q + m` with a half minimum
//! `m = -s z` (`crate::int4_asym`) cannot hold these values: `s z` rounds.
//!
//! Layout, output-major `[out, in]`, inputs in *stored* order:
//! - `codes`: 4-bit: `[out, in / 2]` bytes; each run of 32 inputs is 16
//!   bytes, byte `j` holding input `j` in its low nibble and input `j + 16`
//!   in its high nibble (one mask and one shift decode a run); 8-bit:
//!   `[out, in]` bytes, one code each;
//! - `scales`: `[out, groups]` half bits (finite, either sign);
//! - `zeros`: `[out, groups]` bytes;
//! - `perm` (optional, act-order): stored input `i` is input `perm[i]` of
//!   the layer. GPTQ's `desc_act` assigns input `i` to group `g_idx[i]` in
//!   an order of its own; sorting the inputs by group once, at load, makes
//!   every group contiguous (exllama's approach), and the forward gathers
//!   `x` by `perm` once per call.
//!
//! `in` is a multiple of 32 and `group_size` a positive multiple of 32 (the
//! last group of a row may be shorter). Bits per weight:
//! `bits + 24 / group_size` (a half and a byte per group).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod body;
#[cfg(target_arch = "x86_64")]
mod decode_avx2;
mod dot;
mod quantize;

use std::ops::Range;

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::int4_asym::checks;
use crate::int4_asym::runs::{decode_runs, Decoder};
use crate::linear::dispatch::Dots;
pub use quantize::quantize_rtn;

/// Inputs per run: the unit the kernels decode (16 bytes at 4 bits).
pub const RUN: usize = 32;

/// A zero-point weight `[out, in]` (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ZpWeight {
    codes: Vec<u8>,
    scales: Vec<u16>,
    zeros: Vec<u8>,
    perm: Option<Vec<u32>>,
    out_feat: usize,
    in_feat: usize,
    group_size: usize,
    bits: u32,
}

/// Everything of a weight but its codes: per-group halves and zero points
/// `[out, groups]`, the optional permutation, `[out, in]`, group size and
/// code width (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct ZpParts {
    /// Scale half bits `[out, groups]`.
    pub scales: Vec<u16>,
    /// Zero points `[out, groups]`.
    pub zeros: Vec<u8>,
    /// Stored input `i` is layer input `perm[i]` (act-order).
    pub perm: Option<Vec<u32>>,
    /// `[out, in]`.
    pub shape: [usize; 2],
    /// Inputs per group.
    pub group_size: usize,
    /// Bits per code, 4 or 8.
    pub bits: u32,
}

/// Check the shape, `group_size` and `bits`; returns the groups per row.
pub fn groups_of(out_feat: usize, in_feat: usize, group_size: usize, bits: u32) -> Result<usize> {
    if bits != 4 && bits != 8 {
        return Err(QuantError::arg(format!(
            "bits: expected 4 or 8, got {bits}"
        )));
    }
    checks::group_shape("int_zp", RUN, out_feat, in_feat, group_size)
}

/// Every value of `v` (`[rows, cols]`) below `2^bits`, or an error naming
/// `name` and the first one that is not.
fn check_range(name: &str, v: &[u8], cols: usize, bits: u32) -> Result<()> {
    checks::at_most(name, v, cols, (1u32 << bits) - 1)
}

/// The checks of [`ZpWeight::new`] on the per-group tensors and `perm`.
fn check_parts(
    scales: &[u16],
    zeros: &[u8],
    perm: Option<&[u32]>,
    [out_feat, in_feat, groups]: [usize; 3],
    bits: u32,
) -> Result<()> {
    for (name, len) in [("scales", scales.len()), ("zeros", zeros.len())] {
        if Some(len) != out_feat.checked_mul(groups) {
            return Err(QuantError::dims(
                name,
                format!("{out_feat} x {groups}"),
                len,
            ));
        }
    }
    if let Some(i) = scales.iter().position(|&h| h & 0x7C00 == 0x7C00) {
        return Err(QuantError::arg(format!(
            "scales: row {} group {} is not a finite half (bits {:#06x})",
            i / groups,
            i % groups,
            scales[i]
        )));
    }
    check_range("zeros", zeros, groups, bits)?;
    if let Some(p) = perm {
        if p.len() != in_feat {
            return Err(QuantError::dims("perm", in_feat, p.len()));
        }
        let mut seen = vec![false; in_feat];
        for (i, &v) in p.iter().enumerate() {
            let v = v as usize;
            if v >= in_feat || std::mem::replace(&mut seen[v], true) {
                return Err(QuantError::arg(format!(
                    "perm[{i}] is {v}: expected a permutation of 0..{in_feat}"
                )));
            }
        }
    }
    Ok(())
}

impl ZpWeight {
    /// From packed codes and the other parts (see the module docs for the
    /// layout), validated: every length, every half finite, every zero
    /// point in range, `perm` a permutation of `0..in`.
    pub fn new(codes: Vec<u8>, parts: ZpParts) -> Result<Self> {
        let ZpParts {
            scales,
            zeros,
            perm,
            shape: [out_feat, in_feat],
            group_size,
            bits,
        } = parts;
        let groups = groups_of(out_feat, in_feat, group_size, bits)?;
        let row_bytes = in_feat * bits as usize / 8;
        if Some(codes.len()) != out_feat.checked_mul(row_bytes) {
            return Err(QuantError::dims(
                "codes bytes",
                format!("{out_feat} x {row_bytes}"),
                codes.len(),
            ));
        }
        let dims = [out_feat, in_feat, groups];
        check_parts(&scales, &zeros, perm.as_deref(), dims, bits)?;
        // The identity permutation is no permutation: the forward skips the
        // gather.
        let perm = perm.filter(|p| p.iter().enumerate().any(|(i, &v)| v as usize != i));
        Ok(ZpWeight {
            codes,
            scales,
            zeros,
            perm,
            out_feat,
            in_feat,
            group_size,
            bits,
        })
    }

    /// From unpacked codes `[out, in]` (stored order, each `< 2^bits`) and
    /// the other parts: packs 4-bit codes into runs.
    pub fn from_codes(q: &[u8], parts: ZpParts) -> Result<Self> {
        let [out_feat, in_feat] = parts.shape;
        groups_of(out_feat, in_feat, parts.group_size, parts.bits)?;
        checks::codes("codes", q, out_feat, in_feat, (1u32 << parts.bits) - 1)?;
        let codes = if parts.bits == 8 {
            q.to_vec()
        } else {
            let mut packed = vec![0u8; q.len() / 2];
            packed
                .par_chunks_mut(RUN / 2)
                .zip(q.par_chunks(RUN))
                .for_each(|(b, r)| pack_run(r, b));
            packed
        };
        Self::new(codes, parts)
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.out_feat, self.in_feat]
    }

    /// Inputs per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Bits per code, 4 or 8.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// Groups per output row.
    pub fn groups(&self) -> usize {
        self.in_feat.div_ceil(self.group_size)
    }

    /// The packed codes (see the module docs).
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// The scales' half bits `[out, groups]`.
    pub fn scales(&self) -> &[u16] {
        &self.scales
    }

    /// The zero points `[out, groups]`.
    pub fn zeros(&self) -> &[u8] {
        &self.zeros
    }

    /// The input permutation (stored input `i` is layer input `perm[i]`),
    /// `None` where the inputs are in order.
    pub fn perm(&self) -> Option<&[u32]> {
        self.perm.as_deref()
    }

    /// Bytes stored: codes, halves, zero points and the permutation.
    pub fn nbytes(&self) -> usize {
        self.codes.len()
            + 2 * self.scales.len()
            + self.zeros.len()
            + 4 * self.perm.as_ref().map_or(0, Vec::len)
    }

    fn row_bytes(&self) -> usize {
        self.in_feat * self.bits as usize / 8
    }

    /// The codes of row `r` in stored order, `[in]`.
    pub fn unpacked_row(&self, r: usize) -> Vec<u8> {
        let rb = self.row_bytes();
        let row = &self.codes[r * rb..(r + 1) * rb];
        if self.bits == 8 {
            return row.to_vec();
        }
        let mut q = vec![0u8; self.in_feat];
        for (b, qr) in row.chunks_exact(RUN / 2).zip(q.chunks_exact_mut(RUN)) {
            unpack_run(b, qr);
        }
        q
    }

    /// Decode stored inputs `k0 .. k0 + out.len()` of row `r` (the
    /// engine's tiles) by the body of the level in force
    /// (`crate::int4_asym::runs`).
    pub fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        self.decode_by(Decoder::current(), r, k0, out);
    }

    /// [`ZpWeight::decode`] by `dec`: `Decoder::Scalar` is the reference of
    /// the format, `f32(s) * f32(q - z)`; the AVX2 body its values bit for
    /// bit (`decode_avx2.rs`).
    pub(crate) fn decode_by(&self, dec: Decoder, r: usize, k0: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        let row = &self.codes[r * rb..(r + 1) * rb];
        let groups = self.groups();
        let (sc, zs) = (
            &self.scales[r * groups..(r + 1) * groups],
            &self.zeros[r * groups..(r + 1) * groups],
        );
        let run_bytes = RUN * self.bits as usize / 8;
        decode_runs(k0, out, |run, dst| {
            let g = run * RUN / self.group_size;
            let (s, z) = (half(sc[g]), i32::from(zs[g]));
            let bytes = &row[run * run_bytes..(run + 1) * run_bytes];
            match dec {
                #[cfg(target_arch = "x86_64")]
                Decoder::Avx2(t) => decode_avx2::zp_run(t, bytes, self.bits, s, z, dst),
                Decoder::Scalar => {
                    let mut q = [0u8; RUN];
                    if self.bits == 8 {
                        q.copy_from_slice(bytes);
                    } else {
                        unpack_run(bytes, &mut q);
                    }
                    for (o, &c) in dst.iter_mut().zip(&q) {
                        *o = s * (i32::from(c) - z) as f32;
                    }
                }
            }
        });
    }

    /// Stored row `r` dotted with `x` (`in` floats, stored order) by the
    /// fused kernel of the level `dots` proves (`dot.rs`).
    pub(crate) fn dot_row(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        let (rb, groups) = (self.row_bytes(), self.groups());
        let row = Row {
            codes: &self.codes[r * rb..(r + 1) * rb],
            scales: &self.scales[r * groups..(r + 1) * groups],
            zeros: &self.zeros[r * groups..(r + 1) * groups],
            group_size: self.group_size,
            bits: self.bits,
        };
        dot::dot_row(dots, row, x)
    }

    /// `x [rows, in]` in stored input order: a gather by `perm` (once per
    /// call, for every batch row), or `x` itself.
    pub fn gather<'a>(&self, x: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let Some(p) = &self.perm else {
            return x.into();
        };
        let mut xs = vec![0f32; x.len()];
        xs.par_chunks_mut(self.in_feat)
            .zip(x.par_chunks(self.in_feat))
            .for_each(|(d, s)| d.iter_mut().zip(p).for_each(|(v, &i)| *v = s[i as usize]));
        xs.into()
    }

    /// Rows in stored input order back to layer order: `out[b, perm[i]] =
    /// stored[b, i]` (the input gradient).
    pub fn scatter(&self, stored: &[f32], out: &mut [f32]) {
        let Some(p) = &self.perm else {
            out.copy_from_slice(stored);
            return;
        };
        out.par_chunks_mut(self.in_feat)
            .zip(stored.par_chunks(self.in_feat))
            .for_each(|(d, s)| p.iter().zip(s).for_each(|(&i, &v)| d[i as usize] = v));
    }

    /// The dequantized weight `[out, in]`, inputs in layer order.
    pub fn dequantize(&self) -> Vec<f32> {
        checks::decode_rows(0..self.out_feat, self.in_feat, |r, o| {
            self.decode_layer_order(r, o)
        })
    }

    /// Rows `rows` of the weight as float32 `[rows.len(), in]`, inputs in
    /// layer order (the gradient's tiles: the whole weight is never decoded
    /// at once).
    pub fn dequantize_rows(&self, rows: Range<usize>) -> Result<Vec<f32>> {
        crate::error::check_rows(&rows, self.out_feat)?;
        Ok(checks::decode_rows(rows, self.in_feat, |r, o| {
            self.decode_layer_order(r, o)
        }))
    }

    /// Row `r` into `o` `[in]`, inputs in layer order.
    fn decode_layer_order(&self, r: usize, o: &mut [f32]) {
        if let Some(p) = &self.perm {
            let mut s = vec![0f32; self.in_feat];
            self.decode(r, 0, &mut s);
            p.iter().zip(&s).for_each(|(&i, &v)| o[i as usize] = v);
        } else {
            self.decode(r, 0, o);
        }
    }
}

/// One stored row: its codes, per-group halves and zero points.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub codes: &'a [u8],
    pub scales: &'a [u16],
    pub zeros: &'a [u8],
    pub group_size: usize,
    pub bits: u32,
}

impl Row<'_> {
    /// Bytes per run of 32 codes.
    pub(crate) fn run_bytes(&self) -> usize {
        RUN * self.bits as usize / 8
    }
}

/// The half `h` as f32 (exact).
#[inline]
pub(crate) fn half(h: u16) -> f32 {
    crate::ggml::f16_at(&h.to_le_bytes(), 0)
}

/// 32 codes into one 16-byte run: byte `j` = code `j` | code `j + 16` << 4.
fn pack_run(q: &[u8], b: &mut [u8]) {
    let (lo, hi) = q.split_at(RUN / 2);
    for ((v, &l), &h) in b.iter_mut().zip(lo).zip(hi) {
        *v = l | (h << 4);
    }
}

/// The inverse of [`pack_run`].
fn unpack_run(b: &[u8], q: &mut [u8]) {
    let (lo, hi) = q.split_at_mut(RUN / 2);
    for ((&v, l), h) in b.iter().zip(lo).zip(hi) {
        *l = v & 0x0F;
        *h = v >> 4;
    }
}

#[cfg(test)]
mod tests;
