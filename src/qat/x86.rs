//! The step bodies of `format.rs` compiled for AVX2+FMA, AVX-512 and
//! AVX-512 DQ, where LLVM vectorizes them. Each `#[target_feature]`
//! function is private to its wrapper; the wrappers take the proof token of
//! their instruction set.

#![cfg(target_arch = "x86_64")]

use super::element::Master;
use super::format::{commit_body, dry_body, Coef, CommitChunk, CommitStep, Stats};
use crate::simd::{Avx2, Avx512, Avx512Dq};

/// A token-taking copy of the dry pass and/or the commit pass, compiled
/// with `$features` enabled.
macro_rules! multiversion {
    (dry $features:literal, $token:ty, $name:ident) => {
        /// [`dry_body`] compiled for this instruction set.
        pub(super) fn $name<T: Master>(
            _proof: $token,
            w: &[T],
            g: &[T],
            m: &[T],
            v: &[T],
            c: &Coef<T>,
        ) -> Stats {
            #[target_feature(enable = $features)]
            unsafe fn imp<T: Master>(w: &[T], g: &[T], m: &[T], v: &[T], c: &Coef<T>) -> Stats {
                dry_body(w, g, m, v, c)
            }
            // SAFETY: the token proves the CPU runs these features.
            unsafe { imp(w, g, m, v, c) }
        }
    };
    (commit $features:literal, $token:ty, $name:ident) => {
        /// [`commit_body`] compiled for this instruction set.
        pub(super) fn $name<T: Master>(
            _proof: $token,
            s: CommitStep<'_, T>,
            x: CommitChunk<'_, T>,
        ) {
            #[target_feature(enable = $features)]
            unsafe fn imp<T: Master>(s: CommitStep<'_, T>, x: CommitChunk<'_, T>) {
                commit_body(s, x)
            }
            // SAFETY: the token proves the CPU runs these features.
            unsafe { imp(s, x) }
        }
    };
}

multiversion!(dry "avx2,fma", Avx2, dry_avx2);
multiversion!(commit "avx2,fma", Avx2, commit_avx2);
multiversion!(dry "avx512f,avx512bw,avx512vl,avx2,fma", Avx512, dry_avx512);
multiversion!(commit "avx512f,avx512bw,avx512vl,avx2,fma", Avx512, commit_avx512);
// With AVX-512 DQ the 64-bit multiplies and u64 -> f64 conversions of the
// stochastic-rounding hash vectorize too (only the commit pass draws).
multiversion!(
    commit "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma",
    Avx512Dq,
    commit_avx512dq
);
