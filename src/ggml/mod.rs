//! ggml's block quantization types (the `GGMLQuantizationType`s of GGUF
//! files), one small file per type, like ggml's per-type table: the block
//! constants, the exact scalar dequantization of one block and a plain
//! round-to-nearest quantization of one block. The layouts are ggml's
//! (`ggml-common.h`, `ggml-quants.c` in llama.cpp; facts, not code):
//! little-endian, IEEE half scales, `[out, in]` rows of blocks.
//!
//! Dequantization evaluates the same float32 expressions in the same order
//! as ggml and `gguf.quants` (a product, then an add or subtract, each
//! rounded), so it is bit for bit theirs. The forward decodes a block into
//! f32 lanes and dots it with the SIMD kernels of `crate::linear`
//! (`crate::format::GgufBlocks`).

mod f16;
mod k_scales;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

use std::fmt::Debug;

pub(crate) use f16::{f16_at, f32_to_f16, put_f16};
pub use q4_0::Q4_0;
pub use q4_1::Q4_1;
pub use q4_k::Q4K;
pub use q5_0::Q5_0;
pub use q5_1::Q5_1;
pub use q5_k::Q5K;
pub use q6_k::Q6K;
pub use q8_0::Q8_0;

/// The most weights one block holds (`QK_K`).
pub const MAX_BLOCK_ELEMS: usize = 256;

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
        T::HALF_SCALES
            .iter()
            .map(|&o| f16_at(b, o))
            .find(|v| !v.is_finite())
            .map(|v| (i, v))
    })
}

#[cfg(test)]
mod tests;
