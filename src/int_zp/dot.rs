//! The fused row dot of `int_zp`: per group `g` of a row,
//! `s_g * (sum(q x) - z_g * sum(x))`, summed over groups. The codes are
//! never decoded to a float weight: each run of 32 codes is widened to f32
//! and multiply-added with `x`, while `x` is summed alongside (the zero
//! point's term). One scalar reference ([`dot_row_scalar`]) and one body
//! per ISA (`avx2.rs`, `avx512.rs`: each ISA's code widening around the
//! generic group loop of `body.rs`), picked from the proof tokens of
//! `crate::linear::dispatch::Dots`.
//!
//! Rounding: the result is within `(in + 3) * eps_f32 * sum_i |s| (|q_i| +
//! |z|) |x_i|` of the exact value (the sums reassociate; each group adds
//! one product, one difference and one scaled sum).

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{half, unpack_run, Row, RUN};
use crate::linear::dispatch::Dots;

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
