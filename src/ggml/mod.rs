//! ggml's block quantization types (the `GGMLQuantizationType`s of GGUF
//! files), one small file per type, like ggml's per-type table: the block
//! constants, the exact scalar dequantization of one block and a plain
//! round-to-nearest quantization of one block. The layouts are ggml's
//! (`ggml-common.h`, `ggml-quants.c` in llama.cpp; facts, not code):
//! little-endian, IEEE half scales, `[out, in]` rows of blocks.
//!
//! Dequantization evaluates the same float32 expressions in the same order
//! as ggml and `gguf.quants` (a product, then an add or subtract, each
//! rounded), so it is bit for bit theirs.
//!
//! Every type is also read as signed int8 codes and one affine map per
//! sub-block, `w = a_j * q + c_j` (the same f32 product and sum as the
//! dequantization, so bit for bit the same weight): the fused row dot
//! (`fused.rs`) sums `a_j * sum(q x) + c_j * sum(x)` per sub-block without
//! a float weight, and the tile decode of the batched forward evaluates the
//! map on f32 lanes. The scalar code extraction ([`GgmlType::codes`]) is the
//! reference; `codes_x86.rs` extracts the same codes with AVX2 integer
//! instructions for the AVX2 and AVX-512 bodies (`avx2.rs`, `avx512.rs`,
//! one generic body in `body.rs`; the AVX2 row dot is the multi-row kernel
//! of `rows_avx2.rs`).

mod a8;
#[cfg(target_arch = "x86_64")]
mod a8_kquant_lanes_x86;
#[cfg(target_arch = "x86_64")]
mod a8_kquant_x86;
#[cfg(target_arch = "x86_64")]
mod a8_legacy_x86;
#[cfg(target_arch = "x86_64")]
mod a8_x86;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod body;
#[cfg(target_arch = "x86_64")]
mod codes_x86;
mod f16;
mod fused;
mod k_scales;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod legacy_avx2;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
pub mod quantize;
#[cfg(target_arch = "x86_64")]
mod rows_avx2;
#[cfg(target_arch = "x86_64")]
mod rows_k_avx2;
mod xq;

use std::fmt::Debug;

pub(crate) use a8::{dot_row_a8, A8Dots};
pub(crate) use f16::{f16_at, f32_to_f16, put_f16};
pub(crate) use fused::{decode_block, dot_row, dot_rows};
pub use legacy::Legacy;
pub use q4_0::Q4_0;
pub use q4_1::Q4_1;
pub use q4_k::Q4K;
pub use q5_0::Q5_0;
pub use q5_1::Q5_1;
pub use q5_k::Q5K;
pub use q6_k::Q6K;
pub use q8_0::Q8_0;
pub(crate) use xq::Xq;

/// The most weights one block holds (`QK_K`).
pub const MAX_BLOCK_ELEMS: usize = 256;

/// The most sub-blocks (scales) one block holds (Q6_K's 16).
pub const MAX_SUBS: usize = 16;

/// A block's signed codes, one per weight (`GgmlType::codes`).
pub type Codes = [i8; MAX_BLOCK_ELEMS];

/// A block's affine maps `(a_j, c_j)` per sub-block (`GgmlType::factors`):
/// `MAX_SUBS` of each, the first `ELEMS / SUB` used.
pub type Factors = ([f32; MAX_SUBS], [f32; MAX_SUBS]);

/// A block's integer sub-block multipliers and minimums
/// (`GgmlType::a8_ints`), `MAX_SUBS` of each, the first `ELEMS / SUB` used.
pub type A8Ints = ([i16; MAX_SUBS], [i16; MAX_SUBS]);

/// One ggml block type.
pub trait GgmlType: Copy + Debug + Default + Send + Sync + 'static {
    /// gguf's `GGMLQuantizationType` name, lower case (`q4_0`).
    const NAME: &'static str;
    /// gguf's `GGMLQuantizationType` value.
    const GGML_TYPE: u32;
    /// Weights per block.
    const ELEMS: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// Byte offsets of the block's IEEE half scales (each must be finite).
    const HALF_SCALES: &'static [usize];

    /// Decode block `b` (`BYTES` bytes) into `out` (`ELEMS` floats).
    fn dequantize_block(b: &[u8], out: &mut [f32]);

    /// Encode `x` (`ELEMS` finite floats) into block `b` (`BYTES` bytes),
    /// round to nearest.
    fn quantize_block(x: &[f32], b: &mut [u8]);

    /// Where a 32-weight block keeps its codes, for the AVX2 row dot of
    /// those types (`Legacy::No`, the default, for the others).
    const LEGACY: Legacy = Legacy::No;

    /// Weights per sub-block (one affine map each): 32, or 16 (Q6_K).
    const SUB: usize = 32;
    /// Whether the maps have an offset (`c_j != 0`: the `_1` and k-quant
    /// types with a minimum); the fused dot skips `sum(x)` otherwise.
    const AFFINE: bool = false;

    /// The affine maps of block `b`: weight `i` is `a[i / SUB] * q_i +
    /// c[i / SUB]`, both f32 operations rounded, which is exactly
    /// [`GgmlType::dequantize_block`]'s value. By default the one step `d`
    /// of a block that starts with it and has no minimum (Q8_0, Q4_0,
    /// Q5_0).
    #[inline(always)]
    fn factors(b: &[u8]) -> Factors {
        let mut a = [0f32; MAX_SUBS];
        a[0] = f16_at(b, 0);
        (a, [0.0; MAX_SUBS])
    }

    /// The signed codes `q_i` of block `b` (the scalar reference of the
    /// code extraction).
    fn codes(b: &[u8], q: &mut Codes);

    /// The int8-activation path (`a8.rs`): the integer multiplier `k_j`
    /// of each sub-block and, for the k-quants with a minimum, its integer
    /// minimum `m_j` (`(w_j = (d k_j) q - (dmin m_j)`); by default `k_j = 1`
    /// and no minimum (the legacy types, whose one sub-block is the block).
    #[inline(always)]
    fn a8_ints(b: &[u8]) -> A8Ints {
        let _ = b;
        ([1; MAX_SUBS], [0; MAX_SUBS])
    }

    /// Whether every code is non-negative (Q4_K, Q5_K): the SIMD
    /// int8-activation bodies then feed the codes to `vpmaddubsw` as they
    /// are, without moving the sign of `q` onto `x`.
    const A8_UNSIGNED: bool = false;

    /// [`GgmlType::a8_ints`] as vectors: `k_j` as 16 int16 lanes and `m_j`
    /// as 8 int16 lanes (the SIMD int8-activation bodies of the k-quants;
    /// by default loaded from `a8_ints`).
    ///
    /// # Safety
    /// AVX2 in force; `BYTES` readable bytes at `b`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn a8_ints_x86(
        b: *const u8,
    ) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m128i) {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract; the arrays hold 16 int16 each.
        unsafe {
            let (k, m) = Self::a8_ints(std::slice::from_raw_parts(b, Self::BYTES));
            (
                _mm256_loadu_si256(k.as_ptr().cast()),
                _mm_loadu_si128(m.as_ptr().cast()),
            )
        }
    }

    /// The int8-activation value of block `b` against an activation block
    /// of scale `dx`: `isum = sum_j k_j sum_{i in j} q_i xq_i` (signed
    /// codes), `msum = sum_j m_j sum_{i in j} xq_i`, `xsum = sum_i xq_i`.
    /// By default the legacy types': `(d dx) isum`, plus `(m dx) xsum` for
    /// those with a minimum `m` (the half at byte 2: Q4_1, Q5_1). The SIMD
    /// bodies evaluate this default on four blocks at a time with the same
    /// roundings (`a8_x86.rs`), so a type with 32 weights per block must
    /// not override it.
    #[inline(always)]
    fn a8_value(b: &[u8], dx: f32, isum: i32, msum: i32, xsum: i32) -> f32 {
        let _ = msum;
        let v = (f16_at(b, 0) * dx) * isum as f32;
        if Self::AFFINE {
            v + (f16_at(b, 2) * dx) * xsum as f32
        } else {
            v
        }
    }

    /// [`GgmlType::codes`] with AVX2 integer instructions: the codes of the
    /// block at `b` (`BYTES` readable bytes), either written to `q` (256
    /// writable bytes) or, where the block stores them as they are (Q8_0),
    /// read in place; returns where they are.
    ///
    /// # Safety
    /// Called only from functions with AVX2 enabled (the per-ISA bodies);
    /// `b` and `q` as above.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn codes_x86(b: *const u8, q: *mut i8) -> *const i8 {
        // SAFETY: the caller's pointers hold `BYTES` and 256 bytes, and `q`
        // is an `i8` buffer of `MAX_BLOCK_ELEMS` (the same layout as `Codes`).
        unsafe {
            let block = std::slice::from_raw_parts(b, Self::BYTES);
            Self::codes(block, &mut *q.cast::<Codes>());
        }
        q
    }

    /// Codes `32c..32c + 32` of the block at `b` as one register (the
    /// int8-activation bodies, `a8_x86.rs`), the same values as
    /// [`GgmlType::codes_x86`] without the trip through memory.
    ///
    /// # Safety
    /// As [`GgmlType::codes_x86`]; `c < ELEMS / 32`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn codes32_x86(b: *const u8, c: usize) -> std::arch::x86_64::__m256i;
}

/// Largest |v| of `x` with its sign (ggml's "max" of the symmetric types).
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// `1 / d`, 0 for `d == 0`.
pub(crate) fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// The first index of a non-finite half scale in `row` (whole blocks of
/// `T`), as a block number and the value.
pub(crate) fn bad_scale<T: GgmlType>(row: &[u8]) -> Option<(usize, f32)> {
    row.chunks_exact(T::BYTES).enumerate().find_map(|(i, b)| {
        // A half is infinite or NaN when its five exponent bits (0x7C of
        // the high byte) are all set: tested on the bits, which is all a
        // finite scale costs.
        T::HALF_SCALES
            .iter()
            .find(|&&o| b[o + 1] & 0x7C == 0x7C)
            .map(|&o| (i, f16_at(b, o)))
    })
}

#[cfg(test)]
mod tests;
