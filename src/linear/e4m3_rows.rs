//! The batch-1 E4M3 row kernel: several output rows per pass over `x`,
//! each code decoded to float32 by integer operations alone.
//!
//! The decode (IEEE 754 binary32 layout; OCP 8-bit floating point, E4M3):
//! a code `s.eeee.mmm` sign-extended to 32 bits, shifted left by 20 and
//! masked with `0x87FF_FFFF` is the float32 `s << 31 | eeee << 23 | mmm <<
//! 20`, whose exponent field is `eeee` and mantissa `mmm`: for `eeee > 0`
//! that is `2^(e - 127) (1 + m/8)` = `E4M3 * 2^-120`; for `eeee = 0` a
//! float32 subnormal `2^-126 (m/8)` = `2^-6 (m/8) * 2^-120`, E4M3's
//! subnormal times the same `2^-120`; `+-0` stay `+-0`. So every non-NaN
//! code is exact. (The NaN codes, which the layers reject, read as
//! `+-480`; the borrowed forward promises only some output for them.)
//!
//! `x` is scaled by `2^112` once per call (exact: a power of two), so each
//! product is the true one times `2^-8`, as in the float16 decode of
//! `avx2::dot_e4m3`, and the sum is multiplied by `2^8` at the end. Two
//! conditions, checked per call, send the work to the per-row dot
//! instead: an `|x| >= 2^16` (or not finite), whose scaled copy would
//! overflow; and DAZ set in the calling thread's MXCSR (by some library of
//! the process), which would read the subnormal weights as zero.

use super::dispatch::Dots;

/// `x` is multiplied by this before the kernel: `2^112`.
pub(crate) const X_SCALE: f32 = f32::from_bits((127 + 112) << 23);
/// The kernel's sums are multiplied by this: `2^8` (`2^120 / 2^112`).
pub(super) const UNSCALE: f32 = 256.0;
/// Every `|x|` must be below this for [`prescaled`]: `2^16`, so that
/// `x * 2^112 < 2^128`.
const X_LIMIT: f32 = 65536.0;

/// The float32 whose bits are `sext(code) << 20 & 0x87FF_FFFF`:
/// `E4M3(code) * 2^-120` (see the module docs).
#[inline(always)]
pub(super) fn e4m3_bits_scalar(code: u8) -> f32 {
    f32::from_bits((((code as i8 as i32) << 20) as u32) & 0x87FF_FFFF)
}

/// `x * 2^112`, or `None` when some `|x|` is `>= 2^16` or not finite.
pub(crate) fn prescaled(x: &[f32]) -> Option<Vec<f32>> {
    x.iter()
        .map(|&v| (v.abs() < X_LIMIT).then_some(v * X_SCALE))
        .collect()
}

/// Whether this thread's MXCSR has DAZ (denormals are zero) set.
#[cfg(target_arch = "x86_64")]
fn daz() -> bool {
    let mut csr = 0u32;
    // SAFETY: `stmxcsr` stores the 4-byte MXCSR at the address given, a
    // live local; SSE is part of x86_64.
    unsafe {
        std::arch::asm!(
            "stmxcsr [{}]",
            in(reg) &mut csr,
            options(nostack, preserves_flags)
        )
    };
    csr & (1 << 6) != 0
}

impl Dots {
    /// Whether [`Dots::e4m3_rows`] has a kernel at this level (DAZ aside).
    pub(crate) fn has_e4m3_rows(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(..) => true,
            _ => false,
        }
    }

    /// `out[i]` = E4M3 row `i` of `codes` (rows of `k` codes) `. x`, for
    /// `xs` = [`prescaled`]`(x)`, where the level has the row kernel (AVX2;
    /// AVX-512 keeps its own dot) and this thread's DAZ is clear; false
    /// (nothing written) elsewhere.
    pub(crate) fn e4m3_rows(self, codes: &[u8], k: usize, xs: &[f32], out: &mut [f32]) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Dots::Avx2(t, _) if !daz() => {
                // SAFETY: the token proves AVX2 and FMA.
                unsafe { super::avx2_e4m3::dot_e4m3_rows(t, codes, k, xs, out) };
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::{decode_table, Fp8Format};
    use crate::linear::format::dot_e4m3_scalar;
    use crate::simd::available_levels;

    /// The decode is exact on all 254 non-NaN codes (E4M3 times `2^-120`,
    /// subnormals and `+-0` included, the sign of zero kept), against the
    /// codec's table.
    #[test]
    fn bits_decode_is_exact_on_every_code() {
        let table = decode_table(Fp8Format::E4M3);
        for c in 0..=255u8 {
            let got = e4m3_bits_scalar(c) as f64 * 2f64.powi(120);
            if c & 0x7F == 0x7F {
                assert_eq!(got.abs(), 480.0, "NaN code {c:#x}");
                continue;
            }
            assert_eq!(got, table[c as usize] as f64, "code {c:#x}");
            assert_eq!(got.is_sign_negative(), c >= 0x80, "sign of {c:#x}");
        }
        // A subnormal by hand: 0x01 = 2^-9.
        assert_eq!(e4m3_bits_scalar(0x01) as f64, 2f64.powi(-129));
    }

    #[test]
    fn prescaled_refuses_what_would_overflow() {
        assert_eq!(prescaled(&[1.0, -0.5]), Some(vec![X_SCALE, -0.5 * X_SCALE]));
        assert_eq!(
            prescaled(&[65535.0]).map(|v| v[0] as f64),
            Some(65535.0 * 2f64.powi(112))
        );
        assert_eq!(prescaled(&[1.0, 65536.0]), None);
        assert_eq!(prescaled(&[f32::NAN]), None);
        assert_eq!(prescaled(&[f32::NEG_INFINITY]), None);
    }

    /// Every code (NaNs aside) alone in a row of zeros, at a position in the
    /// vector body or the tail: the kernel's output is exactly the product
    /// (one nonzero term), for rows in groups of four and alone.
    #[test]
    fn every_code_alone_is_exact() {
        let table = decode_table(Fp8Format::E4M3);
        let codes_ok: Vec<u8> = (0..=255u8).filter(|c| c & 0x7F != 0x7F).collect();
        for k in [1usize, 5, 16, 37, 64, 75] {
            let x: Vec<f32> = (0..k)
                .map(|i| [1.0f32, -0.75, 3.5, 0.015625][i % 4])
                .collect();
            let xs = prescaled(&x).unwrap();
            // 254 rows: row r holds code r at column (r * 7) % k.
            let rows = codes_ok.len();
            let mut codes = vec![0u8; rows * k];
            for (r, &c) in codes_ok.iter().enumerate() {
                codes[r * k + (r * 7) % k] = c;
            }
            for level in available_levels() {
                let dots = Dots::at(level).unwrap();
                // Odd counts: 7 rows (a group of four and three alone), and
                // all 254 (63 groups and two alone).
                for n in [7, rows] {
                    let mut out = vec![f32::NAN; n];
                    if !dots.e4m3_rows(&codes[..n * k], k, &xs, &mut out) {
                        assert!(!dots.has_e4m3_rows(), "{level:?} has the kernel");
                        continue;
                    }
                    for (r, &o) in out.iter().enumerate() {
                        let c = codes_ok[r];
                        let want = table[c as usize] as f64 * x[(r * 7) % k] as f64;
                        assert_eq!(o as f64, want, "{level:?} k {k} code {c:#x}");
                    }
                }
            }
        }
    }

    /// With DAZ set on this thread the kernel declines (the subnormal
    /// weights would read as zero) and writes nothing; cleared, it runs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn declines_under_daz() {
        fn set_csr(v: u32) {
            // SAFETY: `ldmxcsr` loads MXCSR from a live local; the value is
            // the thread's own with only the DAZ bit changed.
            unsafe {
                std::arch::asm!("ldmxcsr [{}]", in(reg) &v, options(nostack, preserves_flags))
            };
        }
        fn csr() -> u32 {
            let mut v = 0u32;
            // SAFETY: `stmxcsr` stores MXCSR into a live local.
            unsafe {
                std::arch::asm!("stmxcsr [{}]", in(reg) &mut v, options(nostack, preserves_flags))
            };
            v
        }
        let dots = Dots::current();
        if !dots.has_e4m3_rows() {
            return;
        }
        let (codes, xs) = ([0x01u8; 40], prescaled(&[1.0f32; 8]).unwrap());
        let before = csr();
        set_csr(before | 1 << 6);
        let mut out = [f32::NAN; 5];
        let ran = dots.e4m3_rows(&codes, 8, &xs, &mut out);
        set_csr(before);
        assert!(!ran && out.iter().all(|v| v.is_nan()));
        assert!(dots.e4m3_rows(&codes, 8, &xs, &mut out));
        // Eight subnormals 2^-9 each.
        assert!(out.iter().all(|&v| v == 8.0 * 2f32.powi(-9)));
    }

    /// Random rows of every code against the scalar table dot, within the
    /// float32 rounding of a sum of `k` terms; row counts 1-9, widths with
    /// and without a tail of 16 and 32.
    #[test]
    fn random_rows_match_the_scalar_dot() {
        for k in [3usize, 16, 31, 33, 100, 577] {
            let x: Vec<f32> = crate::testutil::rand_vec(k, k as u64)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            let xs = prescaled(&x).unwrap();
            for n in 1..10 {
                let codes: Vec<u8> = (0..n * k)
                    .map(|i| {
                        let c = (i * 151 + n * 7) as u8;
                        if c & 0x7F == 0x7F {
                            c ^ 1
                        } else {
                            c
                        }
                    })
                    .collect();
                for level in available_levels() {
                    let mut out = vec![f32::NAN; n];
                    let dots = Dots::at(level).unwrap();
                    if !dots.e4m3_rows(&codes, k, &xs, &mut out) {
                        assert!(!dots.has_e4m3_rows(), "{level:?} has the kernel");
                        continue;
                    }
                    for (r, &o) in out.iter().enumerate() {
                        let row = &codes[r * k..(r + 1) * k];
                        let want = dot_e4m3_scalar(row, &x);
                        let mag: f32 = row
                            .iter()
                            .zip(&x)
                            .map(|(&c, v)| (decode_table(Fp8Format::E4M3)[c as usize] * v).abs())
                            .sum();
                        assert!(
                            (o - want).abs() <= 1e-6 * mag * (k as f32).sqrt() + 1e-30,
                            "{level:?} k {k} n {n} row {r}: {o} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
