//! The double-quantized scale codec: a group of non-negative f32 scales
//! (one per block of some quantized tensor) stored as one 8-bit code per
//! scale plus an f32 pair `(max, step)` per group. The codec knows nothing
//! of what the scales scale: the caller chooses the group (the 4-bit
//! optimizer's is 256 blocks, `optim::format::GROUP_BLOCKS`) and keeps the
//! codes and the pairs where its format stores them.
//!
//! # Format
//!
//! For a group with largest scale `max` and smallest non-zero scale `min`:
//!
//! - `step = log2(min / max) / 254` (0 when `min == max`, and never below
//!   -1: scales are normal f32). `log2` is [`log2_det`], a function of IEEE
//!   double operations only, so the stored step is the same on every CPU
//!   and on the GPU (`src/gpu/kernels/optim.cu` runs the same operations).
//! - Code `c` in `0..=254` decodes to `t[c]`, where `t[c] = max * 2^(c *
//!   step)` computed with a degree-6 polynomial `exp2` in plain f32
//!   operations (no libm), made non-increasing by a running minimum; `t[0]
//!   = max`. Code 255 ([`ZERO_CODE`]) is an all-zero block: scale exactly 0.
//! - The code of a scale `x > 0` is the largest `c <= 254` with `t[c] >=
//!   x`: a scale is rounded *up*, so every value of its block still fits in
//!   `[-1, 1]` after normalization; the relative rounding error is at most
//!   `(max / min)^(1/254) - 1` (0.9 % for four decades).
//! - An all-zero group stores `(max, step) = (0, 0)` and every code 255.
//!
//! The codes are log-spaced between the group's extremes (after QLoRA's
//! double quantization, section 3, which codes the scales linearly); unlike
//! a linear code this never rounds the scale of a block with small values
//! to 0 or to the group's maximum. The code of a scale is defined by the
//! table alone, so the AVX-512 search (a vectorized logarithm for a guess,
//! verified against the table) gives exactly the scalar codes, and a
//! checkpoint decodes the same on every machine.
//!
//! [`ScaleCodec`] picks the kernels once from a proof token; `scalar.rs`
//! is the reference every SIMD twin is tested against.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod bisect;
#[cfg(test)]
mod bisect_tests;
pub(crate) mod coin;
pub(crate) mod direct;
#[cfg(target_arch = "x86_64")]
mod direct_avx512;
mod scalar;

/// The dither's uniform numbers, 16 blocks a vector (AVX-512 DQ).
#[cfg(target_arch = "x86_64")]
pub(crate) use direct_avx512::uniforms as dither_uniforms_avx512;
pub(crate) use scalar::ZERO_CODE;
// The device step's test compares its log2 with this one.
#[cfg(all(test, feature = "gpu"))]
pub(crate) use scalar::log2_det;

use crate::simd::{Avx2, Avx512, Avx512Dq};
use coin::Dither;

/// The codec's kernels for one SIMD level: AVX-512 for the table and the
/// code search when the token is given, else the scalar twin compiled for
/// AVX2 (`avx2.rs`) when that token is given, else the scalar twin. All
/// give bit-identical codes, tables and decoded scales.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScaleCodec {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx512: Option<Avx512>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx2: Option<Avx2>,
    /// AVX-512 with DQ: the row layout's encoder (its dither multiplies 64-bit lanes).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx512_dq: Option<Avx512Dq>,
}

impl ScaleCodec {
    /// The kernels `avx512`, else `avx2`, proves (`None` for both: the
    /// scalar twin).
    pub(crate) fn new(avx512: Option<Avx512>, avx2: Option<Avx2>) -> ScaleCodec {
        ScaleCodec {
            avx512,
            avx2,
            avx512_dq: avx512.and_then(Avx512::dq),
        }
    }

    /// Encode one group of the row layout's fixed grid (`direct::encode`,
    /// or `direct::encode_dithered` with `dither`): the codes, the decoded
    /// scales written back to `s`, the group's largest scale returned.
    pub(crate) fn encode_row(
        &self,
        s: &mut [f32],
        codes: &mut [u8],
        dither: Option<Dither>,
    ) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = self.avx512_dq {
            return match dither {
                Some(d) => direct_avx512::encode_dithered(tok, s, codes, d),
                None => direct_avx512::encode(tok, s, codes),
            };
        }
        match dither {
            Some(d) => direct::encode_dithered(s, codes, d),
            None => direct::encode(s, codes),
        }
    }

    /// Fill the raw table `t[c] = max * 2^(c * step)` (see
    /// `scalar::table_with`).
    fn fill_table(&self, max: f32, step: f32, t: &mut [f32; 256]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = self.avx512 {
            return avx512::exp2_table(tok, max, step, t);
        }
        scalar::fill_table(max, step, t)
    }

    /// Decode the scales of one group (`codes.len()` of them) into `out`.
    pub(crate) fn decode(&self, codes: &[u8], max: f32, step: f32, out: &mut [f32]) {
        let mut t = [0f32; 256];
        match self.avx2 {
            #[cfg(target_arch = "x86_64")]
            Some(tok) if self.avx512.is_none() => avx2::table(tok, max, step, &mut t),
            _ => scalar::table_with(max, step, &mut t, |m, s, t| self.fill_table(m, s, t)),
        }
        scalar::decode_with_table(codes, &t, out);
    }

    /// Encode the (non-negative, finite) scales `s` of one group: writes the
    /// codes, returns `(max, step)` and overwrites `s` with the decoded
    /// scales (each at least the scale it replaces).
    pub(crate) fn encode(&self, s: &mut [f32], codes: &mut [u8]) -> (f32, f32) {
        let mut t = [0f32; 256];
        self.encode_table(s, codes, &mut t)
    }

    /// [`Self::encode`], also leaving the group's decoded table in `t` (all
    /// zeros for an all-zero group): a caller that rounds a scale to a
    /// neighbouring code needs it.
    pub(crate) fn encode_table(
        &self,
        s: &mut [f32],
        codes: &mut [u8],
        t: &mut [f32; 256],
    ) -> (f32, f32) {
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = self.avx512 {
            let search: scalar::PrefixSearch<'_> = &|s, c, g| avx512::dq_search(tok, s, c, g);
            return scalar::encode_with_table(
                s,
                codes,
                |m, st, t| avx512::exp2_table(tok, m, st, t),
                Some(search),
                t,
            );
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(tok) = self.avx2 {
            return avx2::encode_table(tok, s, codes, t);
        }
        scalar::encode_bisect_with_table(s, codes, scalar::fill_table, t)
    }
}

/// The raw scalar table (`t[c] = max * 2^(c * step)` made non-increasing,
/// `t[255] = 0`), for tests that check a decoded scale against its code's
/// neighbours.
#[cfg(test)]
pub(crate) fn scalar_table(max: f32, step: f32) -> [f32; 256] {
    let mut t = [0f32; 256];
    scalar::table_with(max, step, &mut t, scalar::fill_table);
    t
}

#[cfg(test)]
mod tests {
    //! The AVX-512 and AVX2 twins (where the CPU has them) and the scalar
    //! codec's binary search against the scalar walk.
    use super::*;

    #[test]
    fn codes_and_tables_match_scalar() {
        let codecs = [
            Avx512::new().map(|t| ScaleCodec::new(Some(t), None)),
            Avx2::new().map(|t| ScaleCodec::new(None, Some(t))),
            Some(ScaleCodec::new(None, None)),
        ];
        for k in codecs.into_iter().flatten() {
            codes_and_tables_match_scalar_with(k);
        }
    }

    fn codes_and_tables_match_scalar_with(k: ScaleCodec) {
        for spread in [1.0001f32, 1.3, 2.0, 1e3, 1e20] {
            let base: Vec<f32> = (0..256)
                .map(|i| {
                    if i % 31 == 0 {
                        0.0
                    } else {
                        spread.powf(((i * 97) % 256) as f32 / 255.0) * 3e-4
                    }
                })
                .collect();
            for n in [256usize, 255, 17, 3] {
                let (mut s0, mut c0) = (base[..n].to_vec(), vec![0u8; n]);
                let (mut s1, mut c1) = (base[..n].to_vec(), vec![0u8; n]);
                let p0 = scalar::encode(&mut s0, &mut c0);
                let p1 = k.encode(&mut s1, &mut c1);
                assert_eq!((p0, &c0, &s0), (p1, &c1, &s1), "spread {spread} n {n}");
                let (mut d0, mut d1) = (vec![0f32; n], vec![0f32; n]);
                scalar::decode(&c0, p0.0, p0.1, &mut d0);
                k.decode(&c1, p1.0, p1.1, &mut d1);
                assert_eq!(d0, d1);
            }
        }
        for (max, step) in [(1.0f32, -0.001f32), (3e-7, -0.37), (5e3, -1.0), (2.0, 0.0)] {
            let mut t1 = [0f32; 256];
            scalar::table_with(max, step, &mut t1, |m, s, t| k.fill_table(m, s, t));
            assert_eq!(scalar_table(max, step), t1, "{max} {step}");
            let mut t2 = [0f32; 256];
            let mut d = [0f32; 256];
            let codes: Vec<u8> = (0..=255).collect();
            k.decode(&codes, max, step, &mut d);
            t2.copy_from_slice(&d);
            assert_eq!(scalar_table(max, step), t2, "{max} {step}");
        }
    }
    #[test]
    fn row_codes_match_scalar() {
        let Some(tok) = Avx512::new() else {
            eprintln!("skipped: AVX-512 not in force, only the scalar twin would run");
            return;
        };
        let k = ScaleCodec::new(Some(tok), None);
        assert!(k.avx512_dq.is_some(), "every AVX-512 CPU we run on has DQ");
        for spread in [1.0001f32, 1.3, 2.0, 1e3, 1e12, 1e20] {
            let base: Vec<f32> = (0..256)
                .map(|i| match i % 37 {
                    0 => 0.0,
                    5 => 1e-38, // far below the grid: the last code
                    _ => spread.powf(((i * 97) % 256) as f32 / 255.0) * 3e-4,
                })
                .collect();
            for n in [256usize, 255, 33, 17, 16, 12, 3, 1] {
                for dither in [
                    None,
                    Some(Dither::new(9, 4321, 77)),
                    Some(Dither::new(2, 7, 0)),
                ] {
                    let (mut s0, mut c0) = (base[..n].to_vec(), vec![0u8; n]);
                    let (mut s1, mut c1) = (base[..n].to_vec(), vec![0u8; n]);
                    let m0 = match dither {
                        Some(d) => direct::encode_dithered(&mut s0, &mut c0, d),
                        None => direct::encode(&mut s0, &mut c0),
                    };
                    let m1 = k.encode_row(&mut s1, &mut c1, dither);
                    assert_eq!((m0, &c0, &s0), (m1, &c1, &s1), "{spread} {n} {dither:?}");
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod timing {
    //! `cargo test --release --lib scales::timing -- --ignored --nocapture`:
    //! the guess-and-walk encode against the binary search, alternating in
    //! one process (a timing, not a check: speed is held by benches/).
    use super::*;
    use std::time::Instant;

    #[test]
    #[ignore]
    fn walk_against_bisect() {
        let groups: Vec<Vec<f32>> = (0..64u32)
            .map(|g| {
                (0..256u32)
                    .map(|i| {
                        let h = super::coin::splitmix64(((g as u64) << 32) | i as u64);
                        // Absmax-like scales over about a decade and a half.
                        1e-3 * (1.0 + (h >> 40) as f32 / 16_777_216.0 * 30.0)
                    })
                    .collect()
            })
            .collect();
        let levels: Vec<(&str, ScaleCodec)> = vec![
            ("scalar", ScaleCodec::new(None, None)),
            ("avx2", ScaleCodec::new(None, Avx2::new())),
        ];
        for (name, k) in levels {
            let (mut walk, mut bisect) = (0f64, 0f64);
            for _ in 0..20 {
                for use_walk in [true, false] {
                    let t0 = Instant::now();
                    for _ in 0..20 {
                        for g in &groups {
                            let mut s = g.clone();
                            let mut c = [0u8; 256];
                            let mut t = [0f32; 256];
                            if use_walk {
                                match k.avx2 {
                                    Some(tok) => {
                                        avx2::encode_table_walk(tok, &mut s, &mut c, &mut t)
                                    }
                                    None => scalar::encode_with_table(
                                        &mut s,
                                        &mut c,
                                        scalar::fill_table,
                                        None,
                                        &mut t,
                                    ),
                                };
                            } else {
                                k.encode_table(&mut s, &mut c, &mut t);
                            }
                            std::hint::black_box((&s, &c));
                        }
                    }
                    let dt = t0.elapsed().as_secs_f64();
                    if use_walk {
                        walk += dt
                    } else {
                        bisect += dt
                    }
                }
            }
            let n = (20 * 20 * groups.len()) as f64;
            eprintln!(
                "{name}: encode per group walk {:.2} us, bisect {:.2} us, ratio {:.3}",
                walk / n * 1e6,
                bisect / n * 1e6,
                bisect / walk
            );
        }
    }
}
