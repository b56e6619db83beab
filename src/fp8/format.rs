//! OCP 8-bit floating point (OFP8, "OCP 8-bit Floating Point Specification",
//! v1.0, 2023): E4M3 as `float8_e4m3fn` (bias 7, max 448, no infinities,
//! NaN = S.1111.111) and E5M2 (bias 15, max 57344, IEEE infinities and NaNs).
//!
//! This file holds the formats and the scalar reference codec (a leaf, no
//! `unsafe`): round to nearest, ties to even, with subnormals; the
//! non-saturating mode matches `ml_dtypes` casts bit for bit (overflow ->
//! NaN for E4M3, -> inf for E5M2) and the saturating mode clamps finite
//! overflow and infinities to +-max (SATFINITE). Also the constants of the
//! SIMD encoders, which compute the same rounding per 32-bit lane:
//!
//! Encode (the same rounding as `encode_scalar`):
//! - normal range (`|x| >= 2^emin`): round the f32 mantissa to `m` bits with
//!   the integer round-half-even trick `abs + (half - 1) + lsb`, shift, and
//!   rebias the exponent; a carry out of the mantissa bumps the exponent.
//! - subnormal range: `|x| + 2^(emin - m + 23)` in f32 rounds `|x|` to a
//!   multiple of the FP8 subnormal step (IEEE round-to-nearest-even, the
//!   default MXCSR mode), and the low mantissa bits of the sum are the code
//!   (the `float_to_half` "magic number" trick, F. Giesen 2012).
//! - codes above `max_code` (and inf) overflow; NaN takes the canonical code.
//!
//! Decode is a table lookup: a 128-entry magnitude table held in eight zmm
//! registers and indexed with `vpermt2ps` (AVX-512), or a 256-entry gather
//! (AVX2); the sign bit is OR-ed back in.

use std::sync::OnceLock;

/// The two OCP FP8 formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits, no infinities (`float8_e4m3fn`).
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, IEEE-like (`float8_e5m2`).
    E5M2,
}

impl Fp8Format {
    /// Parse a format name (`e4m3`, `float8_e4m3fn`, `e5m2`, ...).
    pub fn parse(s: &str) -> Option<Fp8Format> {
        match s.to_ascii_lowercase().as_str() {
            "e4m3" | "e4m3fn" | "float8_e4m3fn" | "fp8_e4m3" => Some(Fp8Format::E4M3),
            "e5m2" | "float8_e5m2" | "fp8_e5m2" => Some(Fp8Format::E5M2),
            _ => None,
        }
    }

    /// The short name (`e4m3`, `e5m2`).
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }

    /// Explicit mantissa bits.
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            Fp8Format::E4M3 => 3,
            Fp8Format::E5M2 => 2,
        }
    }

    /// Exponent bias.
    pub const fn bias(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 7,
            Fp8Format::E5M2 => 15,
        }
    }

    /// Largest finite magnitude code (sign bit clear).
    pub const fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4M3 => 0x7E,
            Fp8Format::E5M2 => 0x7B,
        }
    }

    /// Largest finite value.
    pub const fn max_value(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    /// Canonical NaN code (sign bit clear) that every NaN input encodes to.
    pub const fn nan_code(self) -> u8 {
        match self {
            Fp8Format::E4M3 => 0x7F,
            Fp8Format::E5M2 => 0x7E,
        }
    }

    /// Code an overflowing magnitude takes without saturation.
    pub const fn overflow_code(self) -> u8 {
        match self {
            Fp8Format::E4M3 => 0x7F, // NaN: E4M3FN has no infinity
            Fp8Format::E5M2 => 0x7C, // +inf
        }
    }
}

/// Encode one f32 (scalar reference).
pub fn encode_scalar(x: f32, fmt: Fp8Format, saturate: bool) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        // NaN keeps its sign and becomes the format's canonical quiet NaN,
        // whatever its payload: ml_dtypes 0.7 gives S.1111.111 for E4M3 and
        // S.11111.10 for E5M2 (checked over random payloads in the tests).
        return sign | fmt.nan_code();
    }
    let overflow = if saturate {
        fmt.max_code()
    } else {
        fmt.overflow_code()
    };
    if abs == 0x7F80_0000 {
        return sign | overflow;
    }
    let exp = (abs >> 23) as i32;
    if exp == 0 {
        // f32 subnormals are below 2^-126, far under half the smallest FP8
        // subnormal (2^-17 for E5M2): they round to zero.
        return sign;
    }
    let m = fmt.mantissa_bits();
    let emin = 1 - fmt.bias();
    let e = exp - 127;
    let full = (abs & 0x7F_FFFF) | 0x80_0000; // value = full * 2^(e - 23)
    let shift = if e >= emin {
        23 - m
    } else {
        23 - m + (emin - e) as u32
    };
    if shift >= 25 {
        return sign; // below half the smallest subnormal
    }
    let mut q = full >> shift;
    let rem = full & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q += 1;
    }
    let code = if e >= emin {
        // A carry out of the mantissa bumps the exponent, as it should.
        (((e + fmt.bias()) as u32) << m) + q - (1 << m)
    } else {
        q // subnormal; q == 1 << m is exactly the smallest normal code
    };
    if code > fmt.max_code() as u32 {
        return sign | overflow;
    }
    sign | code as u8
}

/// Decode one FP8 code (scalar reference).
pub fn decode_scalar(code: u8, fmt: Fp8Format) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let m = fmt.mantissa_bits();
    let mag = (code & 0x7F) as u32;
    let exp_field = mag >> m;
    let man = mag & ((1 << m) - 1);
    let all_ones_exp = (1u32 << (7 - m)) - 1;
    match fmt {
        Fp8Format::E4M3 if mag == 0x7F => return f32::NAN.copysign(sign),
        Fp8Format::E5M2 if exp_field == all_ones_exp => {
            return if man == 0 {
                f32::INFINITY * sign
            } else {
                f32::NAN.copysign(sign)
            };
        }
        _ => {}
    }
    let scale = |p: i32| f32::from_bits(((p + 127) as u32) << 23);
    let v = if exp_field == 0 {
        man as f32 * scale(1 - fmt.bias() - m as i32)
    } else {
        (((1 << m) | man) as f32) * scale(exp_field as i32 - fmt.bias() - m as i32)
    };
    sign * v
}

/// Round `x` onto the FP8 grid and back (a "fake" FP8 cast), scalar.
pub fn round_to_grid_scalar(x: f32, fmt: Fp8Format, saturate: bool) -> f32 {
    decode_scalar(encode_scalar(x, fmt, saturate), fmt)
}

/// The 256-entry decode table of `fmt` (`table[code] = decode_scalar(code)`).
pub fn decode_table(fmt: Fp8Format) -> &'static [f32; 256] {
    static E4M3: OnceLock<[f32; 256]> = OnceLock::new();
    static E5M2: OnceLock<[f32; 256]> = OnceLock::new();
    let cell = match fmt {
        Fp8Format::E4M3 => &E4M3,
        Fp8Format::E5M2 => &E5M2,
    };
    cell.get_or_init(|| std::array::from_fn(|c| decode_scalar(c as u8, fmt)))
}

/// Per-format constants of the encoder, as 32-bit lane values.
pub(crate) struct EncConsts {
    /// `23 - m`: f32 mantissa bits dropped.
    pub shift: i32,
    /// Half a unit of the kept mantissa, minus one (round half even).
    pub round_half_m1: i32,
    /// The exponent rebias, in code units.
    pub exp_adjust: i32,
    /// Bits of the smallest normal FP8 value as f32.
    pub min_normal_bits: i32,
    /// Bits of the subnormal "magic number" `2^(emin - m + 23)`.
    pub magic_bits: i32,
    /// Largest finite code.
    pub max_code: i32,
    /// Code an overflow takes (saturating or not).
    pub overflow_code: i32,
    /// Canonical NaN code.
    pub nan_code: i32,
}

/// The encoder constants of `fmt`.
pub(crate) fn enc_consts(fmt: Fp8Format, saturate: bool) -> EncConsts {
    let m = fmt.mantissa_bits() as i32;
    let emin = 1 - fmt.bias();
    EncConsts {
        shift: 23 - m,
        round_half_m1: (1 << (22 - m)) - 1,
        exp_adjust: (127 - fmt.bias()) << m,
        min_normal_bits: (127 + emin) << 23,
        magic_bits: (127 + emin - m + 23) << 23,
        max_code: fmt.max_code() as i32,
        overflow_code: if saturate {
            fmt.max_code()
        } else {
            fmt.overflow_code()
        } as i32,
        nan_code: fmt.nan_code() as i32,
    }
}

/// Encode a slice with the scalar reference (the SIMD kernels' tails).
pub(crate) fn encode_scalar_slice(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = encode_scalar(v, fmt, saturate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_edges() {
        let f = Fp8Format::E4M3;
        assert_eq!(encode_scalar(448.0, f, false), 0x7E);
        assert_eq!(encode_scalar(464.0, f, false), 0x7E);
        assert_eq!(encode_scalar(465.0, f, false), 0x7F);
        assert_eq!(encode_scalar(465.0, f, true), 0x7E);
        assert_eq!(encode_scalar(-1000.0, f, true), 0xFE);
        assert_eq!(encode_scalar(f32::INFINITY, f, false), 0x7F);
        assert_eq!(encode_scalar(f32::NEG_INFINITY, f, true), 0xFE);
        assert_eq!(encode_scalar(2f32.powi(-9), f, false), 0x01);
        assert_eq!(encode_scalar(2f32.powi(-10), f, false), 0x00); // tie to even
        assert_eq!(encode_scalar(-0.0, f, false), 0x80);
        assert_eq!(round_to_grid_scalar(1.1, f, true), 1.125);
        assert!(decode_scalar(0x7F, f).is_nan());
        assert_eq!(decode_scalar(0x7E, f), 448.0);
        assert_eq!(decode_scalar(0x01, f), 2f32.powi(-9));
    }

    #[test]
    fn e5m2_edges() {
        let f = Fp8Format::E5M2;
        assert_eq!(encode_scalar(57344.0, f, false), 0x7B);
        assert_eq!(encode_scalar(61439.0, f, false), 0x7B);
        assert_eq!(encode_scalar(61440.0, f, false), 0x7C);
        assert_eq!(encode_scalar(60000.0, f, true), 0x7B);
        assert_eq!(decode_scalar(0x7C, f), f32::INFINITY);
        assert_eq!(decode_scalar(0x01, f), 2f32.powi(-16));
    }

    #[test]
    fn every_code_round_trips() {
        for fmt in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for c in 0..=255u8 {
                let v = decode_scalar(c, fmt);
                if v.is_nan() {
                    continue;
                }
                assert_eq!(encode_scalar(v, fmt, false), c, "{fmt:?} code {c:#x}");
            }
        }
    }
}
