//! The scale codec's scalar twin compiled for AVX2 + FMA: the same Rust
//! code (`scalar.rs`, inlined here) in `#[target_feature]` functions, so
//! the compiler vectorizes the table's `exp2` polynomial and the search's
//! logarithm guesses eight scales a register. Rust never contracts a
//! multiply and an add into an FMA and vectorizing keeps each element's
//! IEEE operations, so the tables, codes and decoded scales are the scalar
//! twin's bit for bit (tested in `mod.rs`).

#![cfg(target_arch = "x86_64")]

use super::scalar;
use crate::simd::Avx2;

/// [`scalar::table_with`] over [`scalar::fill_table`].
pub(super) fn table(_proof: Avx2, max: f32, step: f32, t: &mut [f32; 256]) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(max: f32, step: f32, t: &mut [f32; 256]) {
        scalar::table_with(max, step, t, scalar::fill_table);
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(max, step, t) }
}

/// [`scalar::encode_bisect_with_table`] on the scalar table.
pub(super) fn encode_table(
    _proof: Avx2,
    s: &mut [f32],
    codes: &mut [u8],
    t: &mut [f32; 256],
) -> (f32, f32) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(s: &mut [f32], codes: &mut [u8], t: &mut [f32; 256]) -> (f32, f32) {
        scalar::encode_bisect_with_table(s, codes, scalar::fill_table, t)
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(s, codes, t) }
}

/// The guess-and-walk encode compiled for AVX2 (the timing's baseline).
#[cfg(test)]
pub(super) fn encode_table_walk(
    _proof: Avx2,
    s: &mut [f32],
    codes: &mut [u8],
    t: &mut [f32; 256],
) -> (f32, f32) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn imp(s: &mut [f32], codes: &mut [u8], t: &mut [f32; 256]) -> (f32, f32) {
        scalar::encode_with_table(s, codes, scalar::fill_table, None, t)
    }
    // SAFETY: the token proves AVX2 and FMA.
    unsafe { imp(s, codes, t) }
}
