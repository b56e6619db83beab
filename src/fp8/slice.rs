//! Slice codecs: the kernel of `dispatch` on the calling thread, rayon
//! above it for large arrays.
//!
//! Every kernel is single-threaded and element-wise, so results do not depend
//! on the thread count or on how rayon splits the work.

use rayon::prelude::*;

use super::dispatch::Codec;
use super::format::Fp8Format;
use crate::error::Result;
use crate::simd::SimdLevel;

/// Below this many elements a call stays on the calling thread.
const PAR_MIN: usize = 1 << 17;
/// Elements per rayon task (64 KiB of f32: the input stays in L2).
const PAR_CHUNK: usize = 1 << 14;

fn check_len(what: &str, a: usize, b: usize) {
    // Callers (bindings, layers) validate lengths first; a mismatch here is a
    // bug in quantrs, not bad user input.
    assert_eq!(a, b, "fp8 {what}: input and output lengths differ");
}

/// Encode `x` into `out` (one code per element) at an explicit SIMD level,
/// on the calling thread (tests compare every level). A level above the one
/// in force is an error.
///
/// # Panics
/// If `x.len() != out.len()`.
pub fn encode_slice_level(
    level: SimdLevel,
    x: &[f32],
    out: &mut [u8],
    fmt: Fp8Format,
    saturate: bool,
) -> Result<()> {
    check_len("encode", x.len(), out.len());
    Codec::at(level)?.encode(x, out, fmt, saturate);
    Ok(())
}

/// Decode `codes` into `out` at an explicit SIMD level, on the calling
/// thread. A level above the one in force is an error.
///
/// # Panics
/// If `codes.len() != out.len()`.
pub fn decode_slice_level(
    level: SimdLevel,
    codes: &[u8],
    out: &mut [f32],
    fmt: Fp8Format,
) -> Result<()> {
    check_len("decode", codes.len(), out.len());
    Codec::at(level)?.decode(codes, out, fmt);
    Ok(())
}

/// Encode `x` into FP8 codes (round to nearest even). `saturate = false` is
/// bit-for-bit `ml_dtypes`' cast; `saturate = true` clamps finite overflow
/// and infinities to +-max (NaN stays NaN). Parallel above 128 Ki elements.
///
/// # Panics
/// If `x.len() != out.len()`.
pub fn encode_slice(x: &[f32], out: &mut [u8], fmt: Fp8Format, saturate: bool) {
    check_len("encode", x.len(), out.len());
    let codec = Codec::current();
    if x.len() < PAR_MIN {
        codec.encode(x, out, fmt, saturate);
        return;
    }
    out.par_chunks_mut(PAR_CHUNK)
        .zip(x.par_chunks(PAR_CHUNK))
        .for_each(|(o, i)| codec.encode(i, o, fmt, saturate));
}

/// Decode FP8 codes to f32 (exact; NaN codes give a quiet NaN with the
/// code's sign). Parallel above 128 Ki elements.
///
/// # Panics
/// If `codes.len() != out.len()`.
pub fn decode_slice(codes: &[u8], out: &mut [f32], fmt: Fp8Format) {
    check_len("decode", codes.len(), out.len());
    let codec = Codec::current();
    if codes.len() < PAR_MIN {
        codec.decode(codes, out, fmt);
        return;
    }
    out.par_chunks_mut(PAR_CHUNK)
        .zip(codes.par_chunks(PAR_CHUNK))
        .for_each(|(o, c)| codec.decode(c, o, fmt));
}

/// Round `src` onto the FP8 grid into `dst` (encode, then decode), on the
/// calling thread, in L1-sized blocks at the level in force.
///
/// # Panics
/// If `src.len() != dst.len()`.
pub(crate) fn round_to_grid_into(src: &[f32], dst: &mut [f32], fmt: Fp8Format, saturate: bool) {
    check_len("round", src.len(), dst.len());
    let codec = Codec::current();
    let mut codes = [0u8; 512];
    for (s, d) in src.chunks(512).zip(dst.chunks_mut(512)) {
        let c = &mut codes[..s.len()];
        codec.encode(s, c, fmt, saturate);
        codec.decode(c, d, fmt);
    }
}

/// Round every element of `x` onto the FP8 grid in place (encode, then
/// decode), the "fake" FP8 cast used by QAT.
pub fn round_to_grid_slice(x: &mut [f32], fmt: Fp8Format, saturate: bool) {
    fn block(codec: Codec, x: &mut [f32], fmt: Fp8Format, saturate: bool) {
        let mut codes = [0u8; 512];
        for part in x.chunks_mut(512) {
            let c = &mut codes[..part.len()];
            codec.encode(part, c, fmt, saturate);
            codec.decode(c, part, fmt);
        }
    }
    let codec = Codec::current();
    if x.len() < PAR_MIN {
        block(codec, x, fmt, saturate);
    } else {
        x.par_chunks_mut(PAR_CHUNK)
            .for_each(|p| block(codec, p, fmt, saturate));
    }
}
