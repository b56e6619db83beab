//! ggml's quantizers from float: a `[out, in]` float32 matrix to the packed
//! blocks of one ggml type, byte for byte what llama.cpp writes
//! (`ggml_quantize_chunk`) and, for the legacy types, what `gguf-py`'s
//! `gguf.quants.quantize` writes. The formulas are ggml's
//! (`ggml/src/ggml-quants.c`: `quantize_row_*_ref` without an importance
//! matrix, `quantize_row_*_impl` with one); this is our own code evaluating
//! the same float32 expressions in the same order, since a different
//! rounding anywhere moves a code and the bytes differ.
//!
//! - `legacy.rs`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (one block of 32 at a time).
//! - `k_min.rs`: Q4_K, Q5_K (super-blocks of 256: 6-bit scales and
//!   minimums).
//! - `q6_k.rs`: Q6_K (super-blocks of 256: 8-bit signed scales).
//! - `search.rs`: the per-group searches they share (`make_qx_quants`,
//!   `make_qkx2_quants` / `make_qkx3_quants`, `make_qp_quants`).
//!
//! `importance` is llama.cpp's imatrix for one tensor: one non-negative
//! weight per input column (the layer's mean `x^2`), the same for every
//! row. Q8_0 ignores it, as ggml does.

mod k_min;
mod legacy;
mod q6_k;
mod search;
#[cfg(test)]
mod tests;

use rayon::prelude::*;

use super::{GgmlType, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use crate::error::{QuantError, Result};
use crate::int4_asym::bad_rows::LowestBadRow;
use crate::int4_asym::checks;

/// A ggml type that can be quantized from float rows.
pub trait QuantizeRow: GgmlType {
    /// Quantize one row `x` (finite, a multiple of `ELEMS` long) into
    /// `out` (`x.len() / ELEMS * BYTES` bytes); `importance` has `x.len()`
    /// finite non-negative weights.
    fn quantize_row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]);
}

/// `impl QuantizeRow` for a 32-weight type whose blocks `legacy::$block`
/// writes one at a time.
macro_rules! legacy_rows {
    ($($t:ty => $block:ident),* $(,)?) => {$(
        impl QuantizeRow for $t {
            fn quantize_row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
                legacy::row::<Self>(x, importance, out, legacy::$block)
            }
        }
    )*};
}

legacy_rows!(Q4_0 => q4_0, Q4_1 => q4_1, Q5_0 => q5_0, Q5_1 => q5_1);

impl QuantizeRow for Q8_0 {
    fn quantize_row(x: &[f32], _importance: Option<&[f32]>, out: &mut [u8]) {
        for (xb, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(Self::BYTES)) {
            legacy::q8_0(xb, b);
        }
    }
}

impl QuantizeRow for Q4K {
    fn quantize_row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
        k_min::row(x, importance, out, k_min::KMin::Q4K)
    }
}

impl QuantizeRow for Q5K {
    fn quantize_row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
        k_min::row(x, importance, out, k_min::KMin::Q5K)
    }
}

impl QuantizeRow for Q6K {
    fn quantize_row(x: &[f32], importance: Option<&[f32]>, out: &mut [u8]) {
        q6_k::row(x, importance, out)
    }
}

/// Floats of a row checked and then quantized in turn without importance
/// (`quantize_matrix`): 4 KiB, a whole number of blocks of every type (32,
/// 256).
const PIECE: usize = 1024;

/// Quantize the float32 matrix `w` (`out_feat x in_feat`, row-major) to
/// `T`'s packed blocks, rows in parallel. Checks the shape (`in_feat` a
/// positive multiple of `T::ELEMS`), that every value of `w` is finite with
/// |w| <= 65504 (the largest half, which the blocks' scales are stored in)
/// and that `importance` (when given) has `in_feat` finite values `>= 0`.
///
/// `w`'s values are checked row by row inside the parallel loop, right
/// before each row is quantized (the row is then in cache: no pass of its
/// own over `w`, as ggml's quantizer makes none; `crate::int4_asym::bad_rows`).
/// A bad value's error names the first one of the lowest bad row, whatever
/// the thread count.
pub fn quantize_matrix<T: QuantizeRow>(
    w: &[f32],
    out_feat: usize,
    in_feat: usize,
    importance: Option<&[f32]>,
) -> Result<Vec<u8>> {
    if out_feat == 0 || in_feat == 0 || !in_feat.is_multiple_of(T::ELEMS) {
        let want = format!(
            "[out, in] with in a positive multiple of {} ({} blocks)",
            T::ELEMS,
            T::NAME
        );
        return Err(QuantError::dims(
            "w",
            want,
            format!("[{out_feat}, {in_feat}]"),
        ));
    }
    checks::float_shape(w, out_feat, in_feat, importance)?;
    let row_bytes = in_feat / T::ELEMS * T::BYTES;
    let mut out = vec![0u8; out_feat * row_bytes];
    let bad = LowestBadRow::new();
    out.par_chunks_mut(row_bytes)
        .zip(w.par_chunks(in_feat))
        .enumerate()
        .for_each(|(r, (o, x))| {
            if importance.is_some() {
                // The weighted quantizers read the whole row first (its
                // mean square), so the whole row is checked first.
                if bad.admits(r, x) {
                    T::quantize_row(x, importance, o);
                }
                return;
            }
            // Without importance every block stands alone: the row is
            // checked and quantized a piece at a time, so that the loads
            // from memory that the check waits for overlap the blocks'
            // arithmetic (one pass of the check over the whole row stalls
            // on memory, then the blocks find it in cache).
            let piece_bytes = PIECE / T::ELEMS * T::BYTES;
            for (xp, op) in x.chunks(PIECE).zip(o.chunks_mut(piece_bytes)) {
                if !bad.admits(r, xp) {
                    return;
                }
                T::quantize_row(xp, None, op);
            }
        });
    bad.finish(w, in_feat).map(|()| out)
}
