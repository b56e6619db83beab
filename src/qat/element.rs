//! The master precisions the optimizer supports (f64, the default, and f32).

use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Sub};

use crate::fp8::Fp8Format;

/// A master-weight element type.
pub trait Master:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + Debug
    + 'static
    + Into<f64>
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    /// NumPy's name for the dtype.
    const DTYPE: &'static str;
    /// Tag in the serialized form.
    const TAG: u8;
    /// Bytes per element.
    const BYTES: usize;
    /// Zero.
    const ZERO: Self;
    /// Positive infinity.
    const INF: Self;

    /// `x` rounded to this type.
    fn from_f64(x: f64) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Round onto the FP8 grid, to nearest, saturating (NaN stays NaN).
    fn fp8_round(src: &[Self], dst: &mut [Self], fmt: Fp8Format);
    /// Append the little-endian bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// `b` has exactly `BYTES` bytes.
    fn read_le(b: &[u8]) -> Self;
}

/// `x - x`: 0 for a finite `x`, NaN for NaN or +-inf. Summed over a tensor
/// it flags any non-finite value without a branch, so the loop vectorizes.
#[inline(always)]
#[allow(clippy::eq_op)]
pub(crate) fn zero_if_finite<T: Master>(x: T) -> T {
    x - x
}

/// Round `src` onto the FP8 grid (nearest even, saturating, NaN kept).
///
/// The one place the QAT code calls the FP8 codec (the SIMD slice codec of
/// `crate::fp8`, bit-identical to its scalar reference).
pub fn fp8_round_slice(src: &[f32], dst: &mut [f32], fmt: Fp8Format) {
    // Saturating encode then decode through the SIMD codec, in L1-sized
    // blocks (the caller already runs this per rayon chunk).
    crate::fp8::round_to_grid_into(src, dst, fmt, true);
}

/// `x` as f32 rounded to odd (truncate, then set the last bit if inexact).
///
/// Rounding a float64 to FP8 through a round-to-nearest f32 can round twice
/// the wrong way at FP8 ties; rounding the f32 to odd first makes the second
/// rounding correct, because f32 keeps more than two bits beyond FP8's
/// mantissa (Boldo & Melquiond 2008, "Emulation of FMA and correctly rounded
/// sums: proved algorithms using rounding to odd", Theorem 1).
#[inline]
pub fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    let back = f as f64;
    if back == x || x.is_nan() {
        return f;
    }
    // Inexact: step toward zero if round-to-nearest went away from it.
    let bits = f.to_bits();
    let t = if back.abs() > x.abs() { bits - 1 } else { bits };
    f32::from_bits(t | 1)
}

impl Master for f64 {
    const DTYPE: &'static str = "float64";
    const TAG: u8 = 2;
    const BYTES: usize = 8;
    const ZERO: f64 = 0.0;
    const INF: f64 = f64::INFINITY;

    #[inline(always)]
    fn from_f64(x: f64) -> f64 {
        x
    }
    #[inline(always)]
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn abs(self) -> f64 {
        f64::abs(self)
    }
    fn fp8_round(src: &[f64], dst: &mut [f64], fmt: Fp8Format) {
        const B: usize = 256;
        let (mut a, mut b) = ([0f32; B], [0f32; B]);
        for (s, d) in src.chunks(B).zip(dst.chunks_mut(B)) {
            let n = s.len();
            for (t, &x) in a.iter_mut().zip(s) {
                *t = f64_to_f32_odd(x);
            }
            fp8_round_slice(&a[..n], &mut b[..n], fmt);
            for (o, &y) in d.iter_mut().zip(&b[..n]) {
                *o = y as f64;
            }
        }
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read_le(b: &[u8]) -> f64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        f64::from_le_bytes(a)
    }
}

impl Master for f32 {
    const DTYPE: &'static str = "float32";
    const TAG: u8 = 1;
    const BYTES: usize = 4;
    const ZERO: f32 = 0.0;
    const INF: f32 = f32::INFINITY;

    #[inline(always)]
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    #[inline(always)]
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn abs(self) -> f32 {
        f32::abs(self)
    }
    fn fp8_round(src: &[f32], dst: &mut [f32], fmt: Fp8Format) {
        fp8_round_slice(src, dst, fmt);
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read_le(b: &[u8]) -> f32 {
        let mut a = [0u8; 4];
        a.copy_from_slice(b);
        f32::from_le_bytes(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::round_to_grid_scalar;

    #[test]
    fn round_to_odd_fixes_double_rounding() {
        // 1.0625 is the E4M3 tie between 1.0 and 1.125 (ties to 1.0);
        // just above it must round up, though f32 rounds it onto the tie.
        let x = 1.0625 + 1e-12;
        assert_eq!(round_to_grid_scalar(x as f32, Fp8Format::E4M3, true), 1.0);
        let mut out = [0.0f64];
        f64::fp8_round(&[x], &mut out, Fp8Format::E4M3);
        assert_eq!(out[0], 1.125);
        f64::fp8_round(&[1.0625], &mut out, Fp8Format::E4M3);
        assert_eq!(out[0], 1.0);
        f64::fp8_round(&[-1.0625 - 1e-12], &mut out, Fp8Format::E4M3);
        assert_eq!(out[0], -1.125);
        assert_eq!(f64_to_f32_odd(1.0), 1.0);
        assert_eq!(f64_to_f32_odd(1e300), f32::MAX);
    }
}
