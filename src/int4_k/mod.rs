//! k-quant-style INT4 weights (`int4_k`): per output row, groups of 32
//! inputs with unsigned 4-bit codes `q` in `0..=15`; each group has a 6-bit
//! scale code `sc` and a 6-bit minimum code `mn`, and each super-block of
//! groups one IEEE half pair `(D, Dmin)`:
//! `w = (D * sc) * q - (Dmin * mn)`, evaluated in float32 as
//! `d = D * sc` (rounded), `m = Dmin * mn` (rounded), `d * q` (rounded)
//! `- m` (rounded): llama.cpp Q4_K's arithmetic (`ggml-quants.c`,
//! `dequantize_row_q4_K`), with Q4_K's 256-wide super-block widened to the
//! whole row where 256 does not divide `in`.
//!
//! Layout, output-major `[out, in]`:
//! - `codes`: `[out, in / 2]` bytes, each group of 32 in 16 bytes, byte `j`
//!   holding input `j` in its low nibble and input `j + 16` in its high
//!   nibble (the nibble order of `int4_asym` and Q4_1);
//! - `scale_codes`: `[out, (3 * groups + 1) / 2]` bytes: group `g`'s 12-bit
//!   value `v = sc | mn << 6` little-endian in a bit stream, two groups per
//!   three bytes (`b0 = v0 & 0xFF`, `b1 = v0 >> 8 | (v1 & 0xF) << 4`,
//!   `b2 = v1 >> 4`); an odd last group leaves a high nibble that must be 0;
//! - `supers`: `[out, in / super, 2]` halves `(D, Dmin)` (finite).
//!
//! Bits per weight, everything stored: `4 + 12 / 32 + 32 / super`, plus
//! 4 bits per row where `groups` is odd: 4.5 at `super = 256`, 4.43 for a
//! row of 576 inputs (one super-block).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod body;
mod dot;
mod quantize;
#[cfg(target_arch = "x86_64")]
mod row_dm_avx2;

use std::ops::Range;

use rayon::prelude::*;

use crate::error::{QuantError, Result};
use crate::int4_asym::bad_rows::LowestBadRow;
use crate::int4_asym::runs::{decode_runs, Decoder};
use crate::int4_asym::{checks, half};
use crate::linear::dispatch::Dots;
pub use quantize::{row_error, KMethod};

/// Inputs per group (one 16-byte run of nibbles).
pub const GROUP: usize = 32;
/// The super-block where it divides `in` (Q4_K's `QK_K`).
pub const SUPER: usize = 256;
/// The largest scale / minimum code.
pub const CODE_MAX: u8 = 63;

/// Inputs per super-block for rows of `in_feat` inputs: [`SUPER`] where it
/// divides `in_feat`, else the whole row.
pub fn super_block(in_feat: usize) -> usize {
    if in_feat.is_multiple_of(SUPER) {
        SUPER
    } else {
        in_feat
    }
}

/// Bytes of one row's packed scale codes for `groups` groups.
pub fn scale_code_bytes(groups: usize) -> usize {
    (3 * groups).div_ceil(2)
}

/// A k-quant-style INT4 weight `[out, in]` (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct KWeight {
    codes: Vec<u8>,
    scale_codes: Vec<u8>,
    supers: Vec<u16>,
    out_feat: usize,
    in_feat: usize,
}

/// Check the shape; returns the groups per row.
pub fn groups_of(out_feat: usize, in_feat: usize) -> Result<usize> {
    if out_feat == 0 || in_feat == 0 || !in_feat.is_multiple_of(GROUP) {
        return Err(QuantError::arg(format!(
            "int4_k weight shape [{out_feat}, {in_feat}]: expected positive dims with in a \
             multiple of {GROUP}"
        )));
    }
    Ok(in_feat / GROUP)
}

/// `(sc, mn)` of group `g` from a row's packed scale codes.
#[inline]
pub(crate) fn scale_code(row: &[u8], g: usize) -> (u8, u8) {
    let b = &row[3 * (g / 2)..];
    let v = if g.is_multiple_of(2) {
        u16::from(b[0]) | (u16::from(b[1] & 0x0F) << 8)
    } else {
        u16::from(b[1] >> 4) | (u16::from(b[2]) << 4)
    };
    ((v & 0x3F) as u8, (v >> 6) as u8)
}

/// Pack `(sc, mn)` pairs (each `0..=63`) into a row's scale-code bytes.
pub(crate) fn pack_scale_codes(sc: &[u8], mn: &[u8], out: &mut [u8]) {
    out.fill(0);
    for (g, (&s, &m)) in sc.iter().zip(mn).enumerate() {
        let v = u16::from(s) | (u16::from(m) << 6);
        let o = 3 * (g / 2);
        if g.is_multiple_of(2) {
            out[o] = v as u8;
            out[o + 1] |= (v >> 8) as u8;
        } else {
            out[o + 1] |= ((v & 0x0F) as u8) << 4;
            out[o + 2] = (v >> 4) as u8;
        }
    }
}

/// Pack codes (a multiple of 32 of them) into runs of 16 bytes.
pub(crate) fn pack_runs(q: &[u8], out: &mut [u8]) {
    for (qr, br) in q.chunks_exact(GROUP).zip(out.chunks_exact_mut(GROUP / 2)) {
        for (j, b) in br.iter_mut().enumerate() {
            *b = qr[j] | (qr[j + GROUP / 2] << 4);
        }
    }
}

/// Every group's `(d, -m)` of a row (`dm[2g]`, `dm[2g + 1]`), as
/// [`group_dm`] computes them (`-(Dmin * mn)` is `(-Dmin) * mn` exactly),
/// with the super-block halves converted once and the scale codes read two
/// groups (three bytes) at a time: this runs for every row of every call.
pub(crate) fn row_dm(sc_row: &[u8], supers: &[u16], groups_per_super: usize, dm: &mut [f32]) {
    let groups = dm.len() / 2;
    for (s, h) in supers.chunks_exact(2).enumerate() {
        let (big_d, neg_m) = (half(h[0]), -half(h[1]));
        // A super-block starts on an even group: `groups_per_super` is 8,
        // or the whole row.
        let end = ((s + 1) * groups_per_super).min(groups);
        let mut g = s * groups_per_super;
        while g < end {
            let b = &sc_row[3 * (g / 2)..];
            let two = g + 1 < end;
            let v = u32::from(b[0])
                | (u32::from(b[1]) << 8)
                | if two { u32::from(b[2]) << 16 } else { 0 };
            dm[2 * g] = big_d * (v & 0x3F) as f32;
            dm[2 * g + 1] = neg_m * ((v >> 6) & 0x3F) as f32;
            if two {
                dm[2 * g + 2] = big_d * ((v >> 12) & 0x3F) as f32;
                dm[2 * g + 3] = neg_m * ((v >> 18) & 0x3F) as f32;
            }
            g += 2;
        }
    }
}

/// `(d, m)` of group `g` of a row: `D * sc` and `Dmin * mn` in float32.
#[inline]
pub(crate) fn group_dm(
    sc_row: &[u8],
    supers: &[u16],
    groups_per_super: usize,
    g: usize,
) -> (f32, f32) {
    let (sc, mn) = scale_code(sc_row, g);
    let s = g / groups_per_super;
    (
        half(supers[2 * s]) * f32::from(sc),
        half(supers[2 * s + 1]) * f32::from(mn),
    )
}

impl KWeight {
    /// From raw parts (see the module docs for the layout), validated:
    /// every length, every half finite, the padding nibble 0.
    pub fn new(
        codes: Vec<u8>,
        scale_codes: Vec<u8>,
        supers: Vec<u16>,
        out_feat: usize,
        in_feat: usize,
    ) -> Result<Self> {
        let groups = groups_of(out_feat, in_feat)?;
        let nsb = in_feat / super_block(in_feat);
        let sc_bytes = scale_code_bytes(groups);
        if Some(codes.len()) != out_feat.checked_mul(in_feat / 2) {
            let want = format!("{out_feat} x {}", in_feat / 2);
            return Err(QuantError::dims("codes bytes", want, codes.len()));
        }
        if Some(scale_codes.len()) != out_feat.checked_mul(sc_bytes) {
            let want = format!("{out_feat} x {sc_bytes}");
            return Err(QuantError::dims(
                "scale_codes bytes",
                want,
                scale_codes.len(),
            ));
        }
        if Some(supers.len()) != out_feat.checked_mul(2 * nsb) {
            let want = format!("{out_feat} x {nsb} x 2");
            return Err(QuantError::dims("supers halves", want, supers.len()));
        }
        if let Some(i) = supers.iter().position(|&h| h & 0x7C00 == 0x7C00) {
            let what = if i % 2 == 0 { "D" } else { "Dmin" };
            return Err(QuantError::arg(format!(
                "supers: row {} super-block {} {what} is {}, expected a finite half",
                i / (2 * nsb),
                (i / 2) % nsb,
                half(supers[i])
            )));
        }
        if groups % 2 == 1 {
            if let Some(r) = (0..out_feat).find(|r| scale_codes[(r + 1) * sc_bytes - 1] >> 4 != 0) {
                return Err(QuantError::arg(format!(
                    "scale_codes: row {r} padding nibble is {}, expected 0",
                    scale_codes[(r + 1) * sc_bytes - 1] >> 4
                )));
            }
        }
        Ok(KWeight {
            codes,
            scale_codes,
            supers,
            out_feat,
            in_feat,
        })
    }

    /// From unpacked parts: `codes` `[out, in]` (each 0..=15), `sc` and
    /// `mn` `[out, groups]` (each 0..=63), `supers` `[out, in / super, 2]`
    /// half bits; packs them, then validates like [`KWeight::new`].
    /// Quantizers that choose the codes themselves (GPTQ, in Python) write
    /// the format through this.
    pub fn from_codes(
        codes: &[u8],
        sc: &[u8],
        mn: &[u8],
        supers: Vec<u16>,
        out_feat: usize,
        in_feat: usize,
    ) -> Result<Self> {
        let groups = groups_of(out_feat, in_feat)?;
        checks::codes("codes", codes, out_feat, in_feat, 15)?;
        for (name, v) in [("sc", sc), ("mn", mn)] {
            checks::codes(name, v, out_feat, groups, u32::from(CODE_MAX))?;
        }
        let sc_bytes = scale_code_bytes(groups);
        let mut packed = vec![0u8; codes.len() / 2];
        pack_runs(codes, &mut packed);
        let mut scp = vec![0u8; out_feat * sc_bytes];
        for (r, out) in scp.chunks_exact_mut(sc_bytes).enumerate() {
            let g = r * groups..(r + 1) * groups;
            pack_scale_codes(&sc[g.clone()], &mn[g], out);
        }
        KWeight::new(packed, scp, supers, out_feat, in_feat)
    }

    /// Quantize a finite float weight `[out, in]` by `method`; `importance`
    /// (length `in`, finite, >= 0) weighs each input's squared error (1
    /// when absent). Each row of `w` is checked (finite, |w| <= 65504)
    /// right before it is quantized; the error names the first bad value of
    /// the lowest bad row on any thread count.
    pub fn quantize(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        method: KMethod,
        importance: Option<&[f32]>,
    ) -> Result<Self> {
        let groups = groups_of(out_feat, in_feat)?;
        checks::float_shape(w, out_feat, in_feat, importance)?;
        let sb = super_block(in_feat);
        let nsb = in_feat / sb;
        let sc_bytes = scale_code_bytes(groups);
        let mut codes = vec![0u8; out_feat * in_feat / 2];
        let mut scale_codes = vec![0u8; out_feat * sc_bytes];
        let mut supers = vec![0u16; out_feat * 2 * nsb];
        // `w`'s values are checked row by row in the loop.
        let bad = LowestBadRow::new();
        codes
            .par_chunks_mut(in_feat / 2)
            .zip(scale_codes.par_chunks_mut(sc_bytes))
            .zip(supers.par_chunks_mut(2 * nsb))
            .zip(w.par_chunks(in_feat))
            .enumerate()
            .for_each(|(r, (((cr, sr), hr), wr))| {
                if !bad.admits(r, wr) {
                    return;
                }
                let (mut q, mut sc, mut mn) =
                    (vec![0u8; in_feat], vec![0u8; groups], vec![0u8; groups]);
                for s in 0..nsb {
                    let cols = s * sb..(s + 1) * sb;
                    let gs = cols.start / GROUP..cols.end / GROUP;
                    let (d, dmin) = quantize::quantize_super(
                        &wr[cols.clone()],
                        importance.map(|v| &v[cols.clone()]),
                        method,
                        &mut q[cols.clone()],
                        &mut sc[gs.clone()],
                        &mut mn[gs],
                    );
                    hr[2 * s] = d;
                    hr[2 * s + 1] = dmin;
                }
                pack_runs(&q, cr);
                pack_scale_codes(&sc, &mn, sr);
            });
        bad.finish(w, in_feat)?;
        KWeight::new(codes, scale_codes, supers, out_feat, in_feat)
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.out_feat, self.in_feat]
    }

    /// Groups (of 32 inputs) per output row.
    pub fn groups(&self) -> usize {
        self.in_feat / GROUP
    }

    /// Inputs per super-block ([`super_block`]).
    pub fn super_block(&self) -> usize {
        super_block(self.in_feat)
    }

    /// Super-blocks per row.
    pub fn supers_per_row(&self) -> usize {
        self.in_feat / self.super_block()
    }

    /// The packed codes `[out, in / 2]`.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// The packed scale codes `[out, (3 * groups + 1) / 2]`.
    pub fn scale_codes(&self) -> &[u8] {
        &self.scale_codes
    }

    /// The `(D, Dmin)` half bits `[out, supers, 2]`.
    pub fn supers(&self) -> &[u16] {
        &self.supers
    }

    /// Bytes stored: codes, scale codes and halves.
    pub fn nbytes(&self) -> usize {
        self.codes.len() + self.scale_codes.len() + 2 * self.supers.len()
    }

    fn row_parts(&self, r: usize) -> (&[u8], &[u8], &[u16]) {
        let (half_in, scb, nsb) = (
            self.in_feat / 2,
            scale_code_bytes(self.groups()),
            self.supers_per_row(),
        );
        (
            &self.codes[r * half_in..(r + 1) * half_in],
            &self.scale_codes[r * scb..(r + 1) * scb],
            &self.supers[r * 2 * nsb..(r + 1) * 2 * nsb],
        )
    }

    /// The codes `0..=15` of row `r`, `[in]`.
    pub fn unpacked_row(&self, r: usize) -> Vec<u8> {
        let (codes, _, _) = self.row_parts(r);
        let mut q = vec![0u8; self.in_feat];
        for (br, qr) in codes.chunks_exact(GROUP / 2).zip(q.chunks_exact_mut(GROUP)) {
            for (j, &v) in br.iter().enumerate() {
                qr[j] = v & 0x0F;
                qr[j + GROUP / 2] = v >> 4;
            }
        }
        q
    }

    /// `(sc, mn)` of every group of row `r`, `[groups]` each.
    pub fn unpacked_scale_codes(&self, r: usize) -> (Vec<u8>, Vec<u8>) {
        let (_, sr, _) = self.row_parts(r);
        (0..self.groups()).map(|g| scale_code(sr, g)).unzip()
    }

    /// Decode inputs `k0 .. k0 + out.len()` of row `r` (the engine's
    /// tiles) by the body of the level in force
    /// (`crate::int4_asym::runs`).
    pub fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        self.decode_by(Decoder::current(), r, k0, out);
    }

    /// [`KWeight::decode`] by `dec`: `Decoder::Scalar` is the reference of
    /// the format (`d * q - m` per input), the AVX2 body its values bit for
    /// bit (`d * q + (-m)`, the same IEEE operation).
    pub(crate) fn decode_by(&self, dec: Decoder, r: usize, k0: usize, out: &mut [f32]) {
        let (codes, sr, hr) = self.row_parts(r);
        let gps = self.super_block() / GROUP;
        decode_runs(k0, out, |g, dst| {
            let (d, m) = group_dm(sr, hr, gps, g);
            let bytes = &codes[g * GROUP / 2..(g + 1) * GROUP / 2];
            match dec {
                #[cfg(target_arch = "x86_64")]
                Decoder::Avx2(t) => crate::int4_asym::decode_avx2::affine_run(t, bytes, d, -m, dst),
                Decoder::Scalar => {
                    let (lo, hi) = dst.split_at_mut(GROUP / 2);
                    for (j, &b) in bytes.iter().enumerate() {
                        lo[j] = d * f32::from(b & 0x0F) - m;
                        hi[j] = d * f32::from(b >> 4) - m;
                    }
                }
            }
        });
    }

    /// Row `r` dotted with `x` (`in` floats) by the fused kernel of the
    /// level `dots` proves (`dot.rs`).
    pub(crate) fn dot_row(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        let (codes, sr, hr) = self.row_parts(r);
        dot::dot_row(dots, codes, sr, hr, self.super_block(), x)
    }

    /// `out[i]` = row `r0 + i` dotted with `x`: the AVX2 level runs
    /// several rows per pass (`crate::int4_asym::rows_avx2`, shared with
    /// `int4_asym`), the others row by row.
    pub(crate) fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        assert!(r0 + out.len() <= self.out_feat && x.len() == self.in_feat);
        #[cfg(target_arch = "x86_64")]
        if let Dots::Avx2(t, _) = dots {
            crate::int4_asym::rows_avx2::dot_rows(t, dots, self, &self.codes, r0, x, out);
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

    /// Rows `rows` of the weight as float32 `[rows.len(), in]`.
    pub fn dequantize_rows(&self, rows: Range<usize>) -> Result<Vec<f32>> {
        crate::error::check_rows(&rows, self.out_feat)?;
        Ok(checks::decode_rows(rows, self.in_feat, |r, o| {
            self.decode(r, 0, o)
        }))
    }
}

/// `(d, -m)` per group of 32 from the packed codes and the halves.
#[cfg(target_arch = "x86_64")]
impl crate::int4_asym::rows_avx2::GroupScales for KWeight {
    fn group_runs(&self) -> usize {
        1
    }

    fn group_scales(&self, dots: Dots, r: usize, dm: &mut [f32]) {
        let (_, sr, hr) = self.row_parts(r);
        let gps = self.super_block() / GROUP;
        match dots {
            // The codes from this row to the end of the array: the vector
            // unpack reads a row's last groups in place (`row_dm_avx2.rs`).
            Dots::Avx2(_, Some(f)) => {
                let sc = &self.scale_codes[r * sr.len()..];
                row_dm_avx2::row_dm_f16c(f, sc, hr, gps, dm)
            }
            _ => row_dm(sr, hr, gps, dm),
        }
    }

    fn prefetch_scales(&self, rows: Range<usize>) {
        use crate::int4_asym::rows_avx2::prefetch_elems;
        let (scb, nsb) = (scale_code_bytes(self.groups()), 2 * self.supers_per_row());
        prefetch_elems(&self.scale_codes, rows.start * scb, rows.end * scb);
        prefetch_elems(&self.supers, rows.start * nsb, rows.end * nsb);
    }
}

#[cfg(test)]
mod tests;
