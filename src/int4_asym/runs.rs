//! The tile decode that the output-major nibble formats share (`int4_asym`,
//! `int4_k`, `int_zp`): the shared row engine (`crate::linear::kernels`)
//! asks each format for columns `k0 .. k0 + n` of one row as float32, once
//! per row and tile at batches of 4 and more, so at batch 16 the decode of
//! every weight was about as costly as the tile GEMM itself (Zen 3, perf:
//! the scalar per-element decoders took a quarter of a call). Each format
//! decodes whole runs of 32 inputs at a time: by the scalar reference, or
//! by the AVX2 bodies (`decode_avx2.rs`, `crate::int_zp`'s) that compute
//! the same float32 operations in the same order, bit for bit.

use super::RUN;
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;

/// Which body decodes a run: the scalar reference, or AVX2 where in force.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Decoder {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
}

impl Decoder {
    /// The body of the level in force (`QUANTRS_SIMD=scalar` gives the
    /// reference).
    pub(crate) fn current() -> Decoder {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = Avx2::new() {
            return Decoder::Avx2(t);
        }
        Decoder::Scalar
    }

    /// Every body this process may run (tests compare them).
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Decoder> {
        let mut v = vec![Decoder::Scalar];
        #[cfg(target_arch = "x86_64")]
        v.extend(Avx2::new().map(Decoder::Avx2));
        v
    }

    /// Asserts that every body's `decode(body, out)` gives `want` bit for
    /// bit (`what` names the case in the failure).
    #[cfg(test)]
    pub(crate) fn assert_all_give(
        want: &[f32],
        mut decode: impl FnMut(Decoder, &mut [f32]),
        what: &str,
    ) {
        for dec in Decoder::all() {
            let mut got = vec![f32::NAN; want.len()];
            decode(dec, &mut got);
            let same = want
                .iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dec:?} {what}");
        }
    }
}

/// Decode inputs `k0 .. k0 + out.len()` of a row stored in runs of 32:
/// `run(i, dst)` writes the 32 values of run `i` into `dst`. Whole runs go
/// straight into `out`; a partial run at either end (a tile that does not
/// start or end on a multiple of 32) goes through a buffer.
pub(crate) fn decode_runs(k0: usize, out: &mut [f32], mut run: impl FnMut(usize, &mut [f32])) {
    let mut buf = [0f32; RUN];
    let (mut k, end) = (k0, k0 + out.len());
    while k < end {
        let i = k / RUN;
        let from = k - i * RUN;
        let n = (RUN - from).min(end - k);
        let dst = &mut out[k - k0..k - k0 + n];
        if n == RUN {
            run(i, dst);
        } else {
            run(i, &mut buf);
            dst.copy_from_slice(&buf[from..from + n]);
        }
        k += n;
    }
}
