//! The fused row dot of `int4_asym`: per group `g` of a row,
//! `d_g * sum(q x) + m_g * sum(x)`, summed over groups. The codes are never
//! decoded to a float weight: each 16-byte run gives 32 codes (low nibbles:
//! inputs 0..16, high nibbles: 16..32) that are widened to f32 and
//! multiply-added with `x`, while `x` is summed alongside (the minimum's
//! term). One scalar reference (`qx_sx_scalar`, also the tail-free fallback)
//! and one body per ISA (`avx2.rs`, `avx512.rs`), picked from the proof
//! tokens of `crate::linear::dispatch::Dots`.
//!
//! Rounding: the result is within `(in + 2) * eps_f32 * sum_g (|d_g| *
//! sum |q x| + |m_g| * sum |x|)` of the exact value (the sums reassociate;
//! each group adds two products and one sum).

use super::RUN;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::linear::dispatch::Dots;
use crate::linear::fp8_dialect::f16_to_f32;

/// `(sum q x, sum x)` over whole runs of 32: `bytes` holds `x.len() / 2`
/// bytes of nibble runs.
pub(crate) fn qx_sx_scalar(bytes: &[u8], x: &[f32]) -> (f32, f32) {
    let (mut qx, mut sx) = (0f32, 0f32);
    for (b, xr) in bytes.chunks_exact(RUN / 2).zip(x.chunks_exact(RUN)) {
        let (xl, xh) = xr.split_at(RUN / 2);
        for ((&v, &a), &c) in b.iter().zip(xl).zip(xh) {
            qx += f32::from(v & 0x0F) * a + f32::from(v >> 4) * c;
            sx += a + c;
        }
    }
    (qx, sx)
}

/// `(sum q x, sum x)` at the level `dots` proves.
fn qx_sx(dots: Dots, bytes: &[u8], x: &[f32]) -> (f32, f32) {
    debug_assert_eq!(2 * bytes.len(), x.len());
    debug_assert!(x.len().is_multiple_of(RUN));
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL; lengths are whole runs.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::qx_sx(t, bytes, x) },
        // SAFETY: the token proves AVX2 and FMA; lengths are whole runs.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => unsafe { avx2::qx_sx(t, bytes, x) },
        Dots::Scalar => qx_sx_scalar(bytes, x),
    }
}

/// The dot of one row (`codes` `in / 2` bytes, `scales` `(d, m)` halves per
/// group) with `x` (`in` floats, a multiple of 32).
pub(crate) fn dot_row(
    dots: Dots,
    codes: &[u8],
    scales: &[u16],
    group_size: usize,
    x: &[f32],
) -> f32 {
    x.chunks(group_size)
        .zip(codes.chunks(group_size / 2))
        .zip(scales.chunks_exact(2))
        .map(|((xg, cg), s)| {
            let (qx, sx) = qx_sx(dots, cg, xg);
            f16_to_f32(s[0]) * qx + f16_to_f32(s[1]) * sx
        })
        .sum()
}
