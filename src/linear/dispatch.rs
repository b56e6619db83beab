//! Which dot-product kernels the linear layers run: the one place that
//! turns the level in force into proof tokens of `crate::simd`, and the
//! only caller of the per-ISA files.

use super::format::{dot4x4_scalar, dot_e4m3_scalar, dot_f32_scalar, dot_i8_scalar};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
#[cfg(test)]
use crate::error::Result;
use crate::simd::{self, SimdLevel};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx2F16c, Avx512};

/// The dot kernels of one level, with the tokens that let them run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dots {
    Scalar,
    /// AVX2 + FMA; the E4M3 dot also needs F16C (else its scalar twin runs).
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2, Option<Avx2F16c>),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl Dots {
    /// The kernels of the level in force.
    pub(crate) fn current() -> Dots {
        Self::pick(simd::level())
    }

    /// The kernels of `level` (tests), refused above the level in force.
    #[cfg(test)]
    pub(crate) fn at(level: SimdLevel) -> Result<Dots> {
        simd::require(level)?;
        Ok(Self::pick(level))
    }

    fn pick(level: SimdLevel) -> Dots {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::at(level) {
                return Dots::Avx512(t);
            }
            if let Some(t) = Avx2::at(level) {
                return Dots::Avx2(t, t.f16c());
            }
        }
        let _ = level;
        Dots::Scalar
    }

    /// `a . b` (equal lengths).
    pub(crate) fn f32(self, a: &[f32], b: &[f32]) -> f32 {
        match self {
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx512(t) => unsafe { avx512::dot_f32(t, a, b) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(t, _) => unsafe { avx2::dot_f32(t, a, b) },
            Dots::Scalar => dot_f32_scalar(a, b),
        }
    }

    /// E4M3 `codes` (decoded exactly, no NaN codes) `. x`.
    pub(crate) fn e4m3(self, codes: &[u8], x: &[f32]) -> f32 {
        match self {
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx512(t) => unsafe { avx512::dot_e4m3(t, codes, x) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(_, Some(t)) => unsafe { avx2::dot_e4m3(t, codes, x) },
            _ => dot_e4m3_scalar(codes, x),
        }
    }

    /// int8 `q . x`.
    pub(crate) fn i8(self, q: &[i8], x: &[f32]) -> f32 {
        match self {
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx512(t) => unsafe { avx512::dot_i8(t, q, x) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(t, _) => unsafe { avx2::dot_i8(t, q, x) },
            Dots::Scalar => dot_i8_scalar(q, x),
        }
    }

    /// `part[i][j] = xs[i] . ws[j]` over equal-length slices.
    pub(crate) fn dot4x4(self, xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
        match self {
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx512(t) => unsafe { avx512::dot4x4(t, xs, ws, part) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(t, _) => unsafe { avx2::dot4x4(t, xs, ws, part) },
            Dots::Scalar => dot4x4_scalar(xs, ws, part),
        }
    }

    /// `panel[i * width + c] = rows[c * kc + i]` for the 8 rows `c` of
    /// `rows` and `i < kc` (the GEMM's panel layout; see
    /// `kernels::gemm_rows`). AVX-512 keeps the scalar scatter it was tuned
    /// with.
    pub(crate) fn transpose8(self, rows: &[f32], kc: usize, panel: &mut [f32], width: usize) {
        match self {
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(t, _) => unsafe { avx2::transpose8(t, rows, kc, panel, width) },
            _ => transpose8_scalar(rows, kc, panel, width),
        }
    }

    /// [`Dots::transpose8`] of 8 E4M3 weight rows decoded (`codes[c * ldc
    /// ..][..kc]`, row `c`) in one pass, where the level has it (AVX2 with
    /// F16C); false (nothing written) elsewhere, where the caller decodes
    /// the rows and transposes them. Writes what
    /// [`e4m3_panel8_scalar`] writes.
    pub(crate) fn e4m3_panel8(
        self,
        codes: &[u8],
        ldc: usize,
        kc: usize,
        panel: &mut [f32],
        width: usize,
    ) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(_, Some(t)) => {
                let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
                // SAFETY: the token proves the CPU features (AVX2, FMA, F16C).
                unsafe { avx2::e4m3_panel8(t, codes, ldc, kc, panel, width, table) };
                true
            }
            _ => false,
        }
    }
}

/// The scalar twin of [`Dots::e4m3_panel8`]: each code through the E4M3
/// table, scattered into the panel.
#[cfg(test)]
pub(crate) fn e4m3_panel8_scalar(
    codes: &[u8],
    ldc: usize,
    kc: usize,
    panel: &mut [f32],
    width: usize,
) {
    let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
    for c in 0..8 {
        for i in 0..kc {
            panel[i * width + c] = table[codes[c * ldc + i] as usize];
        }
    }
}

/// The scalar twin of [`Dots::transpose8`].
pub(crate) fn transpose8_scalar(rows: &[f32], kc: usize, panel: &mut [f32], width: usize) {
    for (c, row) in rows.chunks_exact(kc.max(1)).take(8).enumerate() {
        for (i, &v) in row[..kc].iter().enumerate() {
            panel[i * width + c] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused E4M3 panel decode writes exactly the table's decode of
    /// every non-NaN code (all 254 of them, in every row and position),
    /// scattered as [`transpose8_scalar`] would; depths with and without a
    /// tail of 8, a row pitch wider than the depth, and the panel's other
    /// columns left alone.
    #[test]
    fn e4m3_panel8_matches_the_table() {
        let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        let all: Vec<u8> = (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect();
        for kc in [1, 7, 8, 13, 64, 254] {
            let ldc = kc + 5;
            // Row c holds the codes from position 37 c on, cycling, so every
            // code lands in several rows and lanes.
            let codes: Vec<u8> = (0..8 * ldc)
                .map(|i| all[(i * 37 + i / ldc * 11) % all.len()])
                .collect();
            let width = 32;
            let mut want = vec![f32::NAN; kc * width];
            e4m3_panel8_scalar(&codes, ldc, kc, &mut want[8..], width);
            // An independent spot check of the layout: input 3 of row 5.
            if kc > 3 {
                assert_eq!(want[3 * width + 8 + 5], table[codes[5 * ldc + 3] as usize]);
            }
            for level in simd::available_levels() {
                let mut got = vec![f32::NAN; kc * width];
                if !Dots::at(level)
                    .unwrap()
                    .e4m3_panel8(&codes, ldc, kc, &mut got[8..], width)
                {
                    continue;
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{level:?} kc {kc} at {i}");
                }
            }
        }
    }

    /// Every level's transpose writes exactly the scalar scatter's panel,
    /// for depths with and without a tail of 8, and leaves the other
    /// columns of the panel alone.
    #[test]
    fn transpose8_matches_scalar() {
        for kc in [1, 7, 8, 13, 64, 76] {
            let rows: Vec<f32> = (0..8 * kc).map(|i| i as f32 * 0.5 - 3.0).collect();
            let width = 32;
            let mut want = vec![f32::NAN; kc * width];
            transpose8_scalar(&rows, kc, &mut want[8..], width);
            for level in simd::available_levels() {
                let mut got = vec![f32::NAN; kc * width];
                Dots::at(level)
                    .unwrap()
                    .transpose8(&rows, kc, &mut got[8..], width);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{level:?} kc {kc} at {i}");
                }
                // An independent spot check of the layout: input 3 of row 5.
                if kc > 3 {
                    assert_eq!(got[3 * width + 8 + 5], rows[5 * kc + 3]);
                }
            }
        }
    }
}
