//! The fused row dot of `int4_asym`: per group `g` of a row,
//! `d_g * sum(q x) + m_g * sum(x)`, summed over groups. The codes are never
//! decoded to a float weight: each 16-byte run gives 32 codes (low nibbles:
//! inputs 0..16, high nibbles: 16..32) that are widened to f32 and
//! multiply-added with `x`, while `x` is summed alongside (the minimum's
//! term). One scalar reference ([`dot_row_scalar`]) and one body per ISA,
//! picked from the proof tokens of `crate::linear::dispatch::Dots`: AVX2 is
//! the multi-row kernel `rows_avx2.rs` (shared with `int4_k`) on one row;
//! AVX-512 is `avx512.rs`, its nibble widening around the generic group
//! loop of `body.rs` (vector accumulators per group, scaled into a row
//! accumulator, one horizontal sum per row).
//!
//! Rounding: the result is within `(in + 3) * eps_f32 * sum_i (|d q_i| +
//! |m|) |x_i|` of the exact value (the sums reassociate; each group adds two
//! products and one sum).

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::{half, RUN};
use crate::linear::dispatch::Dots;

/// The dot of one row (`codes` `in / 2` bytes, `scales` `(d, m)` halves per
/// group) with `x` (`in` floats, a multiple of 32) at the level `dots`
/// proves.
pub(crate) fn dot_row(
    dots: Dots,
    codes: &[u8],
    scales: &[u16],
    group_size: usize,
    x: &[f32],
) -> f32 {
    assert!(2 * codes.len() == x.len() && x.len().is_multiple_of(RUN));
    assert_eq!(scales.len(), 2 * x.len().div_ceil(group_size));
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::dot_row(t, codes, scales, group_size, x) },
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => {
            let mut out = [0f32];
            let s = OneRow { scales, group_size };
            super::rows_avx2::dot_rows(t, dots, &s, codes, 0, x, &mut out);
            out[0]
        }
        Dots::Scalar => dot_row_scalar(codes, scales, group_size, x),
    }
}

/// The scalar reference of [`dot_row`].
pub(crate) fn dot_row_scalar(codes: &[u8], scales: &[u16], group_size: usize, x: &[f32]) -> f32 {
    x.chunks(group_size)
        .zip(codes.chunks(group_size / 2))
        .zip(scales.chunks_exact(2))
        .map(|((xg, cg), s)| {
            let (mut qx, mut sx) = (0f32, 0f32);
            for (b, xr) in cg.chunks_exact(RUN / 2).zip(xg.chunks_exact(RUN)) {
                let (xl, xh) = xr.split_at(RUN / 2);
                for ((&v, &a), &c) in b.iter().zip(xl).zip(xh) {
                    qx += f32::from(v & 0x0F) * a + f32::from(v >> 4) * c;
                    sx += a + c;
                }
            }
            half(s[0]) * qx + half(s[1]) * sx
        })
        .sum()
}

/// One row's `(d, m)` halves, for the AVX2 kernel on a lone row.
#[cfg(target_arch = "x86_64")]
struct OneRow<'a> {
    scales: &'a [u16],
    group_size: usize,
}

#[cfg(target_arch = "x86_64")]
impl super::rows_avx2::GroupScales for OneRow<'_> {
    fn group_runs(&self) -> usize {
        self.group_size / RUN
    }

    fn group_scales(&self, dots: Dots, _: usize, dm: &mut [f32]) {
        super::rows_avx2::halves_to_f32(dots, self.scales, dm);
    }
}
