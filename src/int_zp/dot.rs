//! The fused row dot of `int_zp`: per group `g` of a row,
//! `s_g * (sum(q x) - z_g * sum(x))`, summed over groups. The codes are
//! never decoded to a float weight: each run of 32 codes is widened to f32
//! and multiply-added with `x`, while `x` is summed alongside (the zero
//! point's term). One scalar reference ([`dot_row_scalar`]) and one body
//! per ISA (`avx2.rs`, `avx512.rs`: each ISA's code widening around the
//! generic group loop of `body.rs`), picked from the proof tokens of
//! `crate::linear::dispatch::Dots`.
//!
//! At AVX2 the 4-bit rows go several per pass through the multi-row kernel
//! that `int4_asym` and `int4_k` share (`crate::int4_asym::rows_avx2`:
//! the same runs of 16 bytes, `sum(x)` per group once per call, four rows
//! per load of `x`) with `(d_g, c_g) = (s_g, -(s_g z_g))` ([`ZpWeight::dot_rows`]);
//! `c_g` rounds once, which the bound below absorbs (`eps / 2 * |s z| *
//! |sum(x)|` per group).
//!
//! Rounding: the result is within `(in + 3) * eps_f32 * sum_i |s| (|q_i| +
//! |z|) |x_i|` of the exact value (the sums reassociate; each group adds
//! one product, one difference and one scaled sum).

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{half, unpack_run, Row, ZpWeight, RUN};
use crate::linear::dispatch::Dots;

impl ZpWeight {
    /// `out[i]` = the dot of row `r0 + i` with `x` (stored input order):
    /// 4-bit rows at AVX2 through the multi-row kernel (module docs), the
    /// others row by row ([`ZpWeight::dot_row`]).
    pub(crate) fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        assert!(r0 + out.len() <= self.out_feat && x.len() == self.in_feat);
        #[cfg(target_arch = "x86_64")]
        if let (Dots::Avx2(t, _), 4) = (dots, self.bits) {
            crate::int4_asym::rows_avx2::dot_rows(t, dots, self, &self.codes, r0, x, out);
            return;
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dot_row(dots, r0 + i, x);
        }
    }
}

/// The 4-bit rows' `(d_g, c_g)` for the shared AVX2 kernel: `w = s (q - z)
/// = s q + (-(s z))`.
#[cfg(target_arch = "x86_64")]
impl crate::int4_asym::rows_avx2::GroupScales for ZpWeight {
    fn group_runs(&self) -> usize {
        self.group_size / RUN
    }

    fn group_scales(&self, _: Dots, r: usize, dm: &mut [f32]) {
        // The groups from `dm`, not `self.groups()`: its division per row
        // was a visible part of this short loop (576 inputs, g128: 5 groups).
        let g = dm.len() / 2;
        let (s, z) = (
            &self.scales[r * g..(r + 1) * g],
            &self.zeros[r * g..(r + 1) * g],
        );
        for ((p, &s), &z) in dm.chunks_exact_mut(2).zip(s).zip(z) {
            let s = half(s);
            (p[0], p[1]) = (s, -(s * f32::from(z)));
        }
    }

    /// With F16C, four groups at a time over the whole slot
    /// (`avx2::zp_pairs_f16c`), reading on into the next row's halves and
    /// zero points (every row but the last), then the padding zeroed; the
    /// same floats as [`GroupScales::group_scales`]. The software
    /// conversion of each half took a tenth of a batch-1 call of 576-input
    /// rows at g128.
    ///
    /// [`GroupScales::group_scales`]: crate::int4_asym::rows_avx2::GroupScales::group_scales
    fn group_scales_padded(&self, dots: Dots, r: usize, pairs: usize, dm: &mut [f32]) {
        let g = pairs / 2;
        let (s, z) = (&self.scales[r * g..], &self.zeros[r * g..]);
        match dots {
            Dots::Avx2(_, Some(f)) if s.len() >= dm.len() / 2 && z.len() >= dm.len() / 2 => {
                avx2::zp_pairs_f16c(f, s, z, pairs, dm)
            }
            _ => self.group_scales(dots, r, &mut dm[..pairs]),
        }
    }

    fn prefetch_scales(&self, rows: std::ops::Range<usize>) {
        use crate::int4_asym::rows_avx2::prefetch_elems;
        let g = self.groups();
        prefetch_elems(&self.scales, rows.start * g, rows.end * g);
        prefetch_elems(&self.zeros, rows.start * g, rows.end * g);
    }
}

/// The dot of `row` with `x` (`in` floats, a multiple of 32) at the level
/// `dots` proves.
pub(crate) fn dot_row(dots: Dots, row: Row<'_>, x: &[f32]) -> f32 {
    assert!(x.len().is_multiple_of(RUN) && row.group_size.is_multiple_of(RUN));
    assert_eq!(row.codes.len() * RUN, x.len() * row.run_bytes());
    let groups = x.len().div_ceil(row.group_size);
    assert!(row.scales.len() == groups && row.zeros.len() == groups);
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::dot_row(t, row, x) },
        // SAFETY: the token proves AVX2 and FMA; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => unsafe { avx2::dot_row(t, row, x) },
        Dots::Scalar => dot_row_scalar(row, x),
    }
}

/// The scalar reference of [`dot_row`].
pub(crate) fn dot_row_scalar(row: Row<'_>, x: &[f32]) -> f32 {
    let run_bytes = row.run_bytes();
    let mut q = [0u8; RUN];
    x.chunks(row.group_size)
        .zip(row.codes.chunks(row.group_size / RUN * run_bytes))
        .zip(row.scales.iter().zip(row.zeros))
        .map(|((xg, cg), (&s, &z))| {
            let (mut qx, mut sx) = (0f32, 0f32);
            for (b, xr) in cg.chunks_exact(run_bytes).zip(xg.chunks_exact(RUN)) {
                if row.bits == 8 {
                    q.copy_from_slice(b);
                } else {
                    unpack_run(b, &mut q);
                }
                for (&c, &a) in q.iter().zip(xr) {
                    qx += f32::from(c) * a;
                    sx += a;
                }
            }
            half(s) * (qx - f32::from(z) * sx)
        })
        .sum()
}
