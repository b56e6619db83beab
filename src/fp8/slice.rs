//! Slice codecs: the scalar reference per element, SIMD kernels per ISA
//! (`x86.rs`), rayon above them for large arrays.
//!
//! Every kernel is single-threaded and element-wise, so results do not depend
//! on the thread count or on how rayon splits the work.

use std::sync::OnceLock;

use rayon::prelude::*;

use super::{decode_scalar, encode_scalar, Fp8Format};
use crate::simd::{self, SimdLevel};

/// Below this many elements a call stays on the calling thread.
const PAR_MIN: usize = 1 << 17;
/// Elements per rayon task (64 KiB of f32: the input stays in L2).
const PAR_CHUNK: usize = 1 << 14;

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

fn check_len(what: &str, a: usize, b: usize) {
    // Callers (bindings, layers) validate lengths first; a mismatch here is a
    // bug in quantrs, not bad user input.
    assert_eq!(a, b, "fp8 {what}: input and output lengths differ");
}

/// Encode `x` into `out` (one code per element) at an explicit SIMD level,
/// on the calling thread. A level the CPU lacks falls back to the scalar
/// reference, so tests can ask for every level.
///
/// # Panics
/// If `x.len() != out.len()`.
pub fn encode_slice_level(
    level: SimdLevel,
    x: &[f32],
    out: &mut [u8],
    fmt: Fp8Format,
    saturate: bool,
) {
    check_len("encode", x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    {
        if level == SimdLevel::Avx512 && simd::detected() >= SimdLevel::Avx512 {
            // SAFETY: the CPU has AVX-512 F+BW+VL (checked by `simd::detected`).
            unsafe { super::x86::encode_avx512(x, out, fmt, saturate) };
            return;
        }
        if level >= SimdLevel::Avx2 && simd::detected() >= SimdLevel::Avx2 {
            // SAFETY: the CPU has AVX2 (checked by `simd::detected`).
            unsafe { super::x86::encode_avx2(x, out, fmt, saturate) };
            return;
        }
    }
    let _ = level;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = encode_scalar(v, fmt, saturate);
    }
}

/// Decode `codes` into `out` at an explicit SIMD level, on the calling
/// thread (falls back to the scalar table when the CPU lacks the level).
///
/// # Panics
/// If `codes.len() != out.len()`.
pub fn decode_slice_level(level: SimdLevel, codes: &[u8], out: &mut [f32], fmt: Fp8Format) {
    check_len("decode", codes.len(), out.len());
    let table = decode_table(fmt);
    #[cfg(target_arch = "x86_64")]
    {
        if level == SimdLevel::Avx512 && simd::detected() >= SimdLevel::Avx512 {
            // SAFETY: the CPU has AVX-512 F+BW+VL (checked by `simd::detected`).
            unsafe { super::x86::decode_avx512(codes, out, table) };
            return;
        }
        if level >= SimdLevel::Avx2 && simd::detected() >= SimdLevel::Avx2 {
            // SAFETY: the CPU has AVX2 (checked by `simd::detected`).
            unsafe { super::x86::decode_avx2(codes, out, table) };
            return;
        }
    }
    let _ = level;
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = table[c as usize];
    }
}

/// Encode `x` into FP8 codes (round to nearest even). `saturate = false` is
/// bit-for-bit `ml_dtypes`' cast; `saturate = true` clamps finite overflow
/// and infinities to +-max (NaN stays NaN). Parallel above 128 Ki elements.
///
/// # Panics
/// If `x.len() != out.len()`.
pub fn encode_slice(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    check_len("encode", x.len(), out.len());
    let level = simd::level();
    if x.len() < PAR_MIN {
        encode_slice_level(level, x, out, fmt, saturate);
        return;
    }
    out.par_chunks_mut(PAR_CHUNK)
        .zip(x.par_chunks(PAR_CHUNK))
        .for_each(|(o, i)| encode_slice_level(level, i, o, fmt, saturate));
}

/// Decode FP8 codes to f32 (exact; NaN codes give a quiet NaN with the
/// code's sign). Parallel above 128 Ki elements.
///
/// # Panics
/// If `codes.len() != out.len()`.
pub fn decode_slice(codes: &[u8], out: &mut [f32], fmt: Fp8Format) {
    check_len("decode", codes.len(), out.len());
    let level = simd::level();
    if codes.len() < PAR_MIN {
        decode_slice_level(level, codes, out, fmt);
        return;
    }
    out.par_chunks_mut(PAR_CHUNK)
        .zip(codes.par_chunks(PAR_CHUNK))
        .for_each(|(o, c)| decode_slice_level(level, c, o, fmt));
}

/// Round every element of `x` onto the FP8 grid in place (encode, then
/// decode), the "fake" FP8 cast used by QAT.
pub fn round_to_grid_slice(x: &mut [f32], fmt: Fp8Format, saturate: bool) {
    fn block(level: SimdLevel, x: &mut [f32], fmt: Fp8Format, saturate: bool) {
        let mut codes = [0u8; 512];
        for part in x.chunks_mut(512) {
            let c = &mut codes[..part.len()];
            encode_slice_level(level, part, c, fmt, saturate);
            decode_slice_level(level, c, part, fmt);
        }
    }
    let level = simd::level();
    if x.len() < PAR_MIN {
        block(level, x, fmt, saturate);
    } else {
        x.par_chunks_mut(PAR_CHUNK)
            .for_each(|p| block(level, p, fmt, saturate));
    }
}
