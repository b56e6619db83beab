//! The fused row dot of `int4_k`: per group `g` of 32 inputs,
//! `d_g * sum(q x) - m_g * sum(x)` with `d_g = D * sc_g` and
//! `m_g = Dmin * mn_g` computed from the packed 6-bit codes as the loop
//! reaches the group; the codes are never decoded to a float weight. One
//! scalar reference ([`dot_row_scalar`]) and one body per ISA, picked from
//! the proof tokens of `crate::linear::dispatch::Dots`: AVX2 is the
//! multi-row kernel `crate::int4_asym::rows_avx2` (shared with `int4_asym`)
//! on one row; AVX-512 is `avx512.rs`, its nibble widening around the
//! generic group loop of `body.rs`.
//!
//! Rounding: the result is within `(in + 3) * eps_f32 * sum_i (|d q_i| +
//! |m|) |x_i|` of the exact value (the sums reassociate; each group adds two
//! products and one sum), as for `int4_asym`.

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::{group_dm, scale_code_bytes, GROUP};
use crate::linear::dispatch::Dots;

/// The dot of one row (`codes` `in / 2` bytes, `sc_row` its packed scale
/// codes, `supers` its `(D, Dmin)` halves per super-block of `super_block`
/// inputs) with `x` (`in` floats, a multiple of 32) at the level `dots`
/// proves.
pub(crate) fn dot_row(
    dots: Dots,
    codes: &[u8],
    sc_row: &[u8],
    supers: &[u16],
    super_block: usize,
    x: &[f32],
) -> f32 {
    assert!(2 * codes.len() == x.len() && x.len().is_multiple_of(GROUP));
    assert!(super_block.is_multiple_of(GROUP) && x.len().is_multiple_of(super_block));
    assert_eq!(sc_row.len(), scale_code_bytes(x.len() / GROUP));
    assert_eq!(supers.len(), 2 * (x.len() / super_block));
    let gps = super_block / GROUP;
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::dot_row(t, codes, sc_row, supers, gps, x) },
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => {
            let mut out = [0f32];
            let s = OneRow {
                sc_row,
                supers,
                gps,
            };
            crate::int4_asym::rows_avx2::dot_rows(t, dots, &s, codes, 0, x, &mut out);
            out[0]
        }
        Dots::Scalar => dot_row_scalar(codes, sc_row, supers, gps, x),
    }
}

/// The scalar reference of [`dot_row`] (`gps`: groups per super-block).
pub(crate) fn dot_row_scalar(
    codes: &[u8],
    sc_row: &[u8],
    supers: &[u16],
    gps: usize,
    x: &[f32],
) -> f32 {
    x.chunks_exact(GROUP)
        .zip(codes.chunks_exact(GROUP / 2))
        .enumerate()
        .map(|(g, (xg, b))| {
            let (d, m) = group_dm(sc_row, supers, gps, g);
            let (xl, xh) = xg.split_at(GROUP / 2);
            let (mut qx, mut sx) = (0f32, 0f32);
            for ((&v, &a), &c) in b.iter().zip(xl).zip(xh) {
                qx += f32::from(v & 0x0F) * a + f32::from(v >> 4) * c;
                sx += a + c;
            }
            d * qx - m * sx
        })
        .sum()
}

/// One row's scale codes and halves, for the AVX2 kernel on a lone row.
#[cfg(target_arch = "x86_64")]
struct OneRow<'a> {
    sc_row: &'a [u8],
    supers: &'a [u16],
    gps: usize,
}

#[cfg(target_arch = "x86_64")]
impl crate::int4_asym::rows_avx2::GroupScales for OneRow<'_> {
    fn group_runs(&self) -> usize {
        1
    }

    fn group_scales(&self, dots: Dots, _: usize, dm: &mut [f32]) {
        match dots {
            Dots::Avx2(_, Some(f)) => {
                super::row_dm_avx2::row_dm_f16c(f, self.sc_row, self.supers, self.gps, dm)
            }
            _ => super::row_dm(self.sc_row, self.supers, self.gps, dm),
        }
    }
}
