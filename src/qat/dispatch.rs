//! The QAT step's kernels, chosen once per step from a SIMD level: a
//! [`Kernels`] holds the proof tokens of its instruction set and runs the
//! two passes over rayon tasks with the matching copy of the bodies of
//! `format.rs` (`x86.rs`), or the bodies themselves. Every choice gives
//! bit-identical results.

use rayon::prelude::*;

use super::element::Master;
use super::fake::{Rounding, CHUNK};
use super::format::{commit_body, dry_body, Coef, CommitChunk, CommitStep, Stats};
#[cfg(target_arch = "x86_64")]
use super::x86;
use crate::error::Result;
use crate::simd::{self, Avx2, Avx512, Avx512Dq, SimdLevel};

/// The instruction set of one step, with its proof tokens.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kernels {
    Scalar,
    Avx2(Avx2),
    /// AVX-512, and DQ when the CPU has it (used by stochastic rounding).
    Avx512(Avx512, Option<Avx512Dq>),
}

impl Kernels {
    /// The kernels of the level in force (`simd::level()`).
    pub(crate) fn in_force() -> Kernels {
        Kernels::of(simd::level())
    }

    /// The kernels of `level`; an error for a level above the one in force.
    pub(crate) fn at(level: SimdLevel) -> Result<Kernels> {
        simd::require(level)?;
        Ok(Kernels::of(level))
    }

    fn of(level: SimdLevel) -> Kernels {
        if let Some(t) = Avx512::at(level) {
            Kernels::Avx512(t, t.dq())
        } else if let Some(t) = Avx2::at(level) {
            Kernels::Avx2(t)
        } else {
            Kernels::Scalar
        }
    }

    fn dry_chunk<T: Master>(self, w: &[T], g: &[T], m: &[T], v: &[T], c: &Coef<T>) -> Stats {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(t, _) => x86::dry_avx512(t, w, g, m, v, c),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(t) => x86::dry_avx2(t, w, g, m, v, c),
            _ => dry_body(w, g, m, v, c),
        }
    }

    fn commit_chunk<T: Master>(self, s: CommitStep<'_, T>, x: CommitChunk<'_, T>) {
        let stochastic = matches!(s.rounding, Rounding::Stochastic { .. });
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(_, Some(dq)) if stochastic => x86::commit_avx512dq(dq, s, x),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx512(t, _) => x86::commit_avx512(t, s, x),
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(t) => x86::commit_avx2(t, s, x),
            _ => {
                let _ = stochastic;
                commit_body(s, x)
            }
        }
    }

    /// The dry pass over the whole tensor.
    pub(crate) fn dry<T: Master>(self, w: &[T], g: &[T], m: &[T], v: &[T], c: &Coef<T>) -> Stats {
        w.par_chunks(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks(CHUNK).zip(v.par_chunks(CHUNK)))
            .map(|((w, g), (m, v))| self.dry_chunk(w, g, m, v, c))
            .reduce(|| Stats::EMPTY, Stats::merge)
    }

    /// The commit pass over the whole tensor.
    pub(crate) fn commit<T: Master>(
        self,
        s: CommitStep<'_, T>,
        (w, g, m, v): (&mut [T], &[T], &mut [T], &mut [T]),
        q: &mut [T],
    ) {
        w.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
            .zip(q.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (((w, g), (m, v)), q))| {
                let offset = i * CHUNK;
                self.commit_chunk(
                    s,
                    CommitChunk {
                        w,
                        g,
                        m,
                        v,
                        q,
                        offset,
                    },
                )
            });
    }
}
