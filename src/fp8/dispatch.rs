//! Which FP8 slice codec runs: the one place that turns a [`SimdLevel`]
//! into a proof token of `crate::simd`, and the only caller of the per-ISA
//! files.

use super::format::{decode_table, encode_scalar_slice, Fp8Format};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::error::Result;
use crate::simd::{self, SimdLevel};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};

/// A slice codec with the token that lets it run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Codec {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    #[cfg(target_arch = "x86_64")]
    Avx512(Avx512),
}

impl Codec {
    /// The codec of the level in force.
    pub(crate) fn current() -> Codec {
        Self::pick(simd::level())
    }

    /// The codec of `level`, refused (an error) above the level in force.
    pub(crate) fn at(level: SimdLevel) -> Result<Codec> {
        simd::require(level)?;
        Ok(Self::pick(level))
    }

    fn pick(level: SimdLevel) -> Codec {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::at(level) {
                return Codec::Avx512(t);
            }
            if let Some(t) = Avx2::at(level) {
                return Codec::Avx2(t);
            }
        }
        let _ = level;
        Codec::Scalar
    }

    /// Encode `x` into `out` (equal lengths, checked by the caller).
    pub(crate) fn encode(self, x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
        match self {
            Codec::Scalar => encode_scalar_slice(x, out, fmt, saturate),
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Codec::Avx2(t) => unsafe { avx2::encode(t, x, out, fmt, saturate) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Codec::Avx512(t) => unsafe { avx512::encode(t, x, out, fmt, saturate) },
        }
    }

    /// Decode `codes` into `out` (equal lengths, checked by the caller).
    pub(crate) fn decode(self, codes: &[u8], out: &mut [f32], fmt: Fp8Format) {
        let table = decode_table(fmt);
        match self {
            Codec::Scalar => {
                for (o, &c) in out.iter_mut().zip(codes) {
                    *o = table[c as usize];
                }
            }
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Codec::Avx2(t) => unsafe { avx2::decode(t, codes, out, table) },
            // SAFETY: the token proves the CPU features.
            #[cfg(target_arch = "x86_64")]
            Codec::Avx512(t) => unsafe { avx512::decode(t, codes, out, table) },
        }
    }
}
