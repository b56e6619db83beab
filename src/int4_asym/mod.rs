//! Asymmetric INT4 weights: per group of `group_size` inputs of one output
//! row, unsigned codes `q` in `0..=15`, an IEEE half step `d` and an IEEE
//! half minimum `m`, `w = d * q + m` (ggml Q4_1's convention and float32
//! evaluation order: the product rounded, then the add; at group 32 the
//! values are Q4_1's bit for bit). Bits per weight `4 + 32 / group_size`
//! (a last, shorter group where `group_size` does not divide `in`: its
//! scales are counted too).
//!
//! Layout, output-major `[out, in]`:
//! - `codes`: `[out, in / 2]` bytes; each run of 32 inputs is 16 bytes,
//!   byte `j` holding input `j` in its low nibble and input `j + 16` in its
//!   high nibble (Q4_1's nibble order, so a 32-run decodes with one mask and
//!   one shift);
//! - `scales`: `[out, groups, 2]` halves, `(d, m)` per group (finite).
//!
//! `in` is a multiple of 32 and `group_size` a positive multiple of 32.
//! The quantizers (`search`) choose `(d, m)` per group; the codes are then
//! the nearest grid points, which is optimal for the chosen `(d, m)`.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod bad_rows;
#[cfg(target_arch = "x86_64")]
pub(crate) mod batch_avx2;
#[cfg(target_arch = "x86_64")]
mod body;
pub(crate) mod checks;
#[cfg(target_arch = "x86_64")]
pub(crate) mod decode_avx2;
mod dot;
#[cfg(target_arch = "x86_64")]
mod matvec_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod rows_avx2;
pub(crate) mod runs;
mod search;

use std::ops::Range;

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::linear::dispatch::Dots;
use crate::linear::fp8_dialect::f16_to_f32;
use bad_rows::LowestBadRow;
use runs::{decode_runs, Decoder};
pub use search::{group_error, quantize_group, AsymMethod};

/// Inputs per nibble run (16 bytes).
pub const RUN: usize = 32;

/// An asymmetric INT4 weight `[out, in]` (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct AsymWeight {
    codes: Vec<u8>,
    scales: Vec<u16>,
    out_feat: usize,
    in_feat: usize,
    group_size: usize,
}

/// Check `in_feat` and `group_size`; returns the number of groups per row.
pub fn groups_of(out_feat: usize, in_feat: usize, group_size: usize) -> Result<usize> {
    checks::group_shape("int4_asym", RUN, out_feat, in_feat, group_size)
}

impl AsymWeight {
    /// From raw parts (see the module docs for the layout), validated:
    /// every length, and every half finite.
    pub fn new(
        codes: Vec<u8>,
        scales: Vec<u16>,
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
    ) -> Result<Self> {
        let groups = groups_of(out_feat, in_feat, group_size)?;
        if Some(codes.len()) != out_feat.checked_mul(in_feat / 2) {
            return Err(QuantError::dims(
                "codes bytes",
                format!("{out_feat} x {}", in_feat / 2),
                codes.len(),
            ));
        }
        if Some(scales.len()) != out_feat.checked_mul(2 * groups) {
            return Err(QuantError::dims(
                "scales halves",
                format!("{out_feat} x {groups} x 2"),
                scales.len(),
            ));
        }
        if let Some(i) = scales.iter().position(|&h| h & 0x7C00 == 0x7C00) {
            let what = if i % 2 == 0 { "d" } else { "m" };
            return Err(QuantError::arg(format!(
                "scales: row {} group {} {what} is {}, expected a finite half",
                i / (2 * groups),
                (i / 2) % groups,
                f16_to_f32(scales[i])
            )));
        }
        Ok(AsymWeight {
            codes,
            scales,
            out_feat,
            in_feat,
            group_size,
        })
    }

    /// From unpacked codes `[out, in]` (each 0..=15) and the half pairs
    /// `(d, m)` `[out, groups, 2]`: packs the codes into the stored layout,
    /// then validates like [`AsymWeight::new`]. Quantizers that choose the
    /// codes themselves (GPTQ, in Python) write the format through this.
    pub fn from_codes(
        codes: &[u8],
        scales: Vec<u16>,
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
    ) -> Result<Self> {
        groups_of(out_feat, in_feat, group_size)?;
        checks::codes("codes", codes, out_feat, in_feat, 15)?;
        let mut packed = vec![0u8; codes.len() / 2];
        pack_runs(codes, &mut packed);
        AsymWeight::new(packed, scales, out_feat, in_feat, group_size)
    }

    /// Quantize a finite float weight `[out, in]` by `method`; `importance`
    /// (length `in`, finite, >= 0) weighs each input's squared error in the
    /// search (1 when absent; ignored by `Rtn`). Each row of `w` is checked
    /// (finite, |w| <= 65504) right before it is quantized; the error names
    /// the first bad value of the lowest bad row on any thread count.
    pub fn quantize(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
        method: AsymMethod,
        importance: Option<&[f32]>,
    ) -> Result<Self> {
        let groups = groups_of(out_feat, in_feat, group_size)?;
        checks::float_shape(w, out_feat, in_feat, importance)?;
        let mut codes = vec![0u8; out_feat * in_feat / 2];
        let mut scales = vec![0u16; out_feat * groups * 2];
        // `w`'s values are checked row by row in the loop (`bad_rows`).
        let bad = LowestBadRow::new();
        codes
            .par_chunks_mut(in_feat / 2)
            .zip(scales.par_chunks_mut(2 * groups))
            .zip(w.par_chunks(in_feat))
            .enumerate()
            .for_each(|(r, ((cr, sr), wr))| {
                if !bad.admits(r, wr) {
                    return;
                }
                let mut q = vec![0u8; group_size];
                for (g, s) in sr.chunks_exact_mut(2).enumerate() {
                    let cols = g * group_size..((g + 1) * group_size).min(in_feat);
                    let n = cols.len();
                    let imp = importance.map(|i| &i[cols.clone()]);
                    let (d, m) = quantize_group(&wr[cols.clone()], imp, method, &mut q[..n]);
                    s[0] = d;
                    s[1] = m;
                    pack_runs(&q[..n], &mut cr[cols.start / 2..cols.end / 2]);
                }
            });
        bad.finish(w, in_feat)?;
        // A group beyond the half range (|w| > 65504) rounds d or m to
        // infinity: refused by the constructor, naming the group.
        AsymWeight::new(codes, scales, out_feat, in_feat, group_size)
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.out_feat, self.in_feat]
    }

    /// Inputs per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Groups per output row.
    pub fn groups(&self) -> usize {
        self.in_feat.div_ceil(self.group_size)
    }

    /// The packed codes `[out, in / 2]`.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// The `(d, m)` half bits `[out, groups, 2]`.
    pub fn scales(&self) -> &[u16] {
        &self.scales
    }

    /// Bytes stored: codes and halves.
    pub fn nbytes(&self) -> usize {
        self.codes.len() + 2 * self.scales.len()
    }

    /// The codes `0..=15` of row `r`, `[in]`.
    pub fn unpacked_row(&self, r: usize) -> Vec<u8> {
        let half = self.in_feat / 2;
        let mut q = vec![0u8; self.in_feat];
        unpack_runs(&self.codes[r * half..(r + 1) * half], &mut q);
        q
    }

    /// Decode inputs `k0 .. k0 + out.len()` of row `r` (the engine's
    /// tiles) by the body of the level in force (`runs.rs`).
    pub fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        self.decode_by(Decoder::current(), r, k0, out);
    }

    /// [`AsymWeight::decode`] by `dec`: `Decoder::Scalar` is the reference
    /// of the format ([`decode_run`]), the AVX2 body its values bit for bit.
    pub(crate) fn decode_by(&self, dec: Decoder, r: usize, k0: usize, out: &mut [f32]) {
        let row_bytes = self.in_feat / 2;
        let row = &self.codes[r * row_bytes..(r + 1) * row_bytes];
        let groups = self.groups();
        let sc = &self.scales[r * 2 * groups..(r + 1) * 2 * groups];
        decode_runs(k0, out, |run, dst| {
            let g = run * RUN / self.group_size;
            let (d, m) = (half(sc[2 * g]), half(sc[2 * g + 1]));
            let bytes = &row[run * RUN / 2..(run + 1) * RUN / 2];
            match dec {
                #[cfg(target_arch = "x86_64")]
                Decoder::Avx2(t) => decode_avx2::affine_run(t, bytes, d, m, dst),
                Decoder::Scalar => decode_run(bytes, d, m, dst),
            }
        });
    }

    /// Row `r` dotted with `x` (`in` floats) by the fused kernel of the
    /// level `dots` proves (`dot.rs`).
    pub(crate) fn dot_row(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        let (half, groups) = (self.in_feat / 2, self.groups());
        dot::dot_row(
            dots,
            &self.codes[r * half..(r + 1) * half],
            &self.scales[r * 2 * groups..(r + 1) * 2 * groups],
            self.group_size,
            x,
        )
    }

    /// `out[i]` = row `r0 + i` dotted with `x`: the AVX2 level runs
    /// several rows per pass (`rows_avx2.rs`), the others row by row.
    pub(crate) fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        assert!(r0 + out.len() <= self.out_feat && x.len() == self.in_feat);
        #[cfg(target_arch = "x86_64")]
        if let Dots::Avx2(t, _) = dots {
            rows_avx2::dot_rows(t, dots, self, &self.codes, r0, x, out);
            return;
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dot_row(dots, r0 + i, x);
        }
    }

    /// The dequantized weight `[out, in]`.
    pub fn dequantize(&self) -> Vec<f32> {
        checks::decode_rows(0..self.out_feat, self.in_feat, |r, o| self.decode(r, 0, o))
    }

    /// Rows `rows` of the weight as float32 `[rows.len(), in]` (the
    /// gradient's tiles: the whole weight is never decoded at once).
    pub fn dequantize_rows(&self, rows: Range<usize>) -> Result<Vec<f32>> {
        crate::error::check_rows(&rows, self.out_feat)?;
        Ok(checks::decode_rows(rows, self.in_feat, |r, o| {
            self.decode(r, 0, o)
        }))
    }
}

/// `(d, m)` per group, converted from the stored halves.
#[cfg(target_arch = "x86_64")]
impl rows_avx2::GroupScales for AsymWeight {
    fn group_runs(&self) -> usize {
        self.group_size / RUN
    }

    fn group_scales(&self, dots: Dots, r: usize, dm: &mut [f32]) {
        let n = 2 * self.groups();
        rows_avx2::halves_to_f32(dots, &self.scales[r * n..(r + 1) * n], dm);
    }

    /// The row's halves and the next row's first ones, as many as fill the
    /// padded slot (8 at a time, no per-row scalar tail), then the padding
    /// zeroed; the last rows, which have no next row's halves to read, take
    /// the exact length.
    fn group_scales_padded(&self, dots: Dots, r: usize, pairs: usize, dm: &mut [f32]) {
        let from = &self.scales[r * pairs..];
        let n = if from.len() >= dm.len() {
            dm.len()
        } else {
            pairs
        };
        rows_avx2::halves_to_f32(dots, &from[..n], &mut dm[..n]);
        // The padding (fewer than 8 floats, in the last 8): a fixed trip
        // count, not a fill of a run-time length (a `memset` call per row).
        let end = dm.len();
        for (j, v) in dm[end - 8..].iter_mut().enumerate() {
            if end - 8 + j >= pairs {
                *v = 0.0;
            }
        }
    }

    fn prefetch_scales(&self, rows: Range<usize>) {
        let n = 2 * self.groups();
        rows_avx2::prefetch_elems(&self.scales, rows.start * n, rows.end * n);
    }
}

/// The half `h` as f32 (exact): normal halves by moving their fields, the
/// rest through the general conversion (`crate::ggml::f16_at`).
#[inline]
pub(crate) fn half(h: u16) -> f32 {
    crate::ggml::f16_at(&h.to_le_bytes(), 0)
}

/// `w = d * q + m` for one run of 32 (16 bytes), in Q4_1's order.
fn decode_run(b: &[u8], d: f32, m: f32, out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(RUN / 2);
    for (j, &q) in b.iter().enumerate() {
        lo[j] = d * f32::from(q & 0x0F) + m;
        hi[j] = d * f32::from(q >> 4) + m;
    }
}

/// Pack codes (a multiple of 32 of them) into runs of 16 bytes.
fn pack_runs(q: &[u8], out: &mut [u8]) {
    for (qr, br) in q.chunks_exact(RUN).zip(out.chunks_exact_mut(RUN / 2)) {
        for (j, b) in br.iter_mut().enumerate() {
            *b = qr[j] | (qr[j + RUN / 2] << 4);
        }
    }
}

/// The inverse of [`pack_runs`].
fn unpack_runs(b: &[u8], q: &mut [u8]) {
    for (br, qr) in b.chunks_exact(RUN / 2).zip(q.chunks_exact_mut(RUN)) {
        for (j, &v) in br.iter().enumerate() {
            qr[j] = v & 0x0F;
            qr[j + RUN / 2] = v >> 4;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
