//! The optimizer's kernels, chosen once per optimizer: a [`Kernels`] holds
//! the proof tokens of the SIMD level it was made for and routes each call
//! to the AVX-512 twin when one fits, else to the AVX2 twin when one fits,
//! else to the scalar twin of `format.rs`; the block scales go through
//! the crate's scale codec (`crate::scales`) at the same level. All give
//! bit-identical results.

use super::format::{self, Codecs, Pass1, Pass2, StepConsts};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::error::Result;
use crate::scales::ScaleCodec;
use crate::simd::{self, Avx2, Avx512, SimdLevel};

/// The kernels of one SIMD level.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernels {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx512: Option<Avx512>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    avx2: Option<Avx2>,
}

impl Kernels {
    /// The kernels of the level in force (`simd::level()`).
    pub(crate) fn in_force() -> Kernels {
        Kernels {
            avx512: Avx512::new(),
            avx2: Avx2::new(),
        }
    }

    /// The kernels of `level`; an error for a level above the one in force.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn at(level: SimdLevel) -> Result<Kernels> {
        simd::require(level)?;
        Ok(Kernels {
            avx512: Avx512::at(level),
            avx2: Avx2::at(level),
        })
    }

    /// Only the scalar twins.
    #[cfg(test)]
    pub(crate) fn scalar() -> Kernels {
        Kernels {
            avx512: None,
            avx2: None,
        }
    }

    /// Pass 1 of one group (the AVX-512 and AVX2 kernels handle per-block v
    /// scales).
    pub(crate) fn pass1(&self, k: &StepConsts, c: &Codecs, bs: usize, p: Pass1<'_>) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), format::VScale::Block(_)) = (self.avx512, &p.v_scale) {
            return avx512::pass1(t, k, c, bs, p);
        }
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), format::VScale::Block(_)) = (self.avx2, &p.v_scale) {
            return avx2::pass1(t, k, c, bs, p);
        }
        format::pass1(k, c, bs, p)
    }

    /// Pass 2 of one group.
    pub(crate) fn pass2(&self, c: &Codecs, bs: usize, p: Pass2<'_>) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), format::VScale::Block(_)) = (self.avx512, &p.v_inv) {
            return avx512::pass2(t, c, bs, p);
        }
        #[cfg(target_arch = "x86_64")]
        if let (Some(t), format::VScale::Block(_)) = (self.avx2, &p.v_inv) {
            return avx2::pass2(t, c, bs, p);
        }
        format::pass2(c, bs, p)
    }

    /// Whether [`Self::pass2_then_1`] interleaves its two passes (AVX2
    /// without AVX-512); otherwise the step runs each group's passes back to
    /// back.
    pub(crate) fn interleaves(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.avx512.is_none() && self.avx2.is_some();
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Pass 2 of one group, then pass 1 of the next (different buffers),
    /// interleaved on AVX2: the same bits as the two calls in turn.
    pub(crate) fn pass2_then_1(
        &self,
        k: &StepConsts,
        c: &Codecs,
        bs: usize,
        p2: Pass2<'_>,
        p1: Pass1<'_>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if let (None, Some(t), format::VScale::Block(_), format::VScale::Block(_)) =
            (self.avx512, self.avx2, &p2.v_inv, &p1.v_scale)
        {
            return avx2::pass2_then_1(t, k, c, bs, p2, p1);
        }
        self.pass2(c, bs, p2);
        self.pass1(k, c, bs, p1);
    }

    /// True when every value of `x` is finite.
    pub(crate) fn all_finite(&self, x: &[f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = self.avx512 {
            return avx512::all_finite(t, x);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = self.avx2 {
            return avx2::all_finite(t, x);
        }
        format::all_finite(x)
    }

    /// AVX-512 with DQ, where this level has it (v's scale rounding,
    /// `dither_avx512.rs`).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn avx512_dq(&self) -> Option<crate::simd::Avx512Dq> {
        self.avx512.and_then(Avx512::dq)
    }

    /// AVX2, where this level has it (v's scale rounding without AVX-512
    /// DQ, `dither_avx2.rs`).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn avx2(&self) -> Option<Avx2> {
        self.avx2
    }

    /// The block-scale codec of this level (`crate::scales`).
    pub(crate) fn scales(&self) -> ScaleCodec {
        ScaleCodec::new(self.avx512, self.avx2)
    }
}

#[cfg(test)]
mod tests {
    //! Every available ISA token against the scalar twin.
    use super::*;
    use crate::optim::codebook::{Codebook16, DYNAMIC4, INT4, NF4};
    use crate::optim::format::{MCodec, VScale};
    use crate::optim::VarianceMap;
    use crate::testutil::xorshift_f32;

    /// The kernels of every SIMD level in force (AVX2 and, where the CPU
    /// has it, AVX-512), empty (with the reason printed) when the CPU or
    /// `QUANTRS_SIMD` leaves only the scalar twin to compare with itself.
    fn simd_kernels() -> Vec<Kernels> {
        let ks: Vec<Kernels> = simd::available_levels()
            .into_iter()
            .filter(|&l| l != SimdLevel::Scalar)
            .map(|l| Kernels::at(l).unwrap())
            .collect();
        if ks.is_empty() {
            eprintln!("skipped: no SIMD level in force, only the scalar twin would run");
        }
        ks
    }

    #[test]
    fn a_level_above_the_one_in_force_is_an_error() {
        for level in [SimdLevel::Neon, SimdLevel::Avx2, SimdLevel::Avx512] {
            let ok = simd::available_levels().contains(&level);
            assert_eq!(Kernels::at(level).is_ok(), ok, "{level:?}");
        }
        assert!(Kernels::at(SimdLevel::Scalar).is_ok());
    }

    #[test]
    fn all_finite_matches_scalar() {
        for k in simd_kernels() {
            for n in [0usize, 1, 15, 16, 17, 100] {
                let x = xorshift_f32(n as u64, n, 1e30);
                assert!(k.all_finite(&x));
                for pos in 0..n {
                    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                        let mut y = x.clone();
                        y[pos] = bad;
                        assert!(!k.all_finite(&y), "{n} {pos}");
                        assert!(!format::all_finite(&y), "{n} {pos}");
                    }
                }
            }
        }
    }

    #[test]
    fn pass2_codes_match_scalar_at_midpoints_and_extremes() {
        for k in simd_kernels() {
            // Every midpoint, its f32 neighbours, the code values, 0, -0, huge, subnormal.
            let m_books = [NF4, INT4, DYNAMIC4];
            for (map, m_book) in VarianceMap::ALL
                .into_iter()
                .zip(m_books.into_iter().cycle())
            {
                let c = Codecs {
                    m: MCodec::Four(Codebook16::new(m_book)),
                    v: Codebook16::new(map.table()),
                    sqrt_domain: map.sqrt_domain(),
                };
                let mut xs = vec![0.0f32, -0.0, 1e-45, 1e-38, 1.0, 2.0, 1e30, f32::MAX];
                let m_cb = Codebook16::new(m_book);
                for (i, cb) in (0..16).flat_map(|i| [(i, &c.v), (i, &m_cb)]) {
                    for base in [cb.mids[i], cb.values[i], cb.mids[i] * 16.0] {
                        if base.is_finite() {
                            xs.extend([
                                base,
                                f32::from_bits(base.to_bits().wrapping_add(1)),
                                f32::from_bits(base.to_bits().wrapping_sub(1)),
                            ]);
                        }
                    }
                }
                let neg: Vec<f32> = xs.iter().map(|x| -x).collect();
                xs.extend(neg);
                xs.resize(xs.len().next_multiple_of(64), 0.5);
                let n = xs.len();
                let inv = vec![1.0f32; n / 64];
                let mut outs = Vec::new();
                for kernels in [Kernels::scalar(), k] {
                    let (mut mc, mut vc) = (vec![0u8; n / 2], vec![0u8; n / 2]);
                    kernels.pass2(
                        &c,
                        64,
                        Pass2 {
                            sm: &xs,
                            su: &xs,
                            m_inv: &inv,
                            v_inv: VScale::Block(&inv),
                            m_codes: &mut mc,
                            v_codes: &mut vc,
                            ahead: [std::ptr::null(); 2],
                        },
                    );
                    outs.push((mc, vc));
                }
                assert_eq!(outs[0], outs[1], "{map:?}");
            }
        }
    }
}
