//! The group loop of the AVX-512 body of `dot::dot_row` (`avx512.rs`),
//! generic over the f32 register type (the AVX2 level runs the multi-row
//! kernel `crate::int4_asym::rows_avx2` instead).

use super::{group_dm, GROUP};
use crate::simd::F32Lanes;

/// The group loop of the AVX-512 body, over any f32 register type `L`:
/// `widen(p)` turns the 16 bytes at `p` (one group of 32 codes) into `V`
/// vectors of f32 codes, vector `j` covering inputs `j * L::LANES..` of
/// the group; vector `j` multiply-adds into accumulator `j % 2`, and `x` is
/// summed alongside for the minimum's term. Each group's `(d, m)` comes
/// from its packed 6-bit codes and its super-block's halves.
///
/// # Safety
/// The caller's target features cover `L`'s intrinsics and `widen`'s, and
/// `dot::dot_row`'s length checks hold (`x.len() == 2 * codes.len()`, a
/// multiple of 32; the scale codes and halves of every group present);
/// `V * L::LANES == 32`.
#[inline(always)]
pub(super) unsafe fn dot_row_body<L: F32Lanes, const V: usize>(
    codes: &[u8],
    sc_row: &[u8],
    supers: &[u16],
    gps: usize,
    x: &[f32],
    widen: impl Fn(*const u8) -> [L; V],
) -> f32 {
    debug_assert_eq!(V * L::LANES, GROUP);
    let (pb, px) = (codes.as_ptr(), x.as_ptr());
    // SAFETY: every pointer is inside `codes` / `x` by the length checks
    // above; the features are the caller's.
    unsafe {
        let mut total = L::zero();
        for g in 0..x.len() / GROUP {
            let i = g * GROUP;
            let (mut q, mut s) = ([L::zero(); 2], [L::zero(); 2]);
            for (j, w) in widen(pb.add(i / 2)).into_iter().enumerate() {
                let xv = L::load(px.add(i + j * L::LANES));
                q[j % 2] = L::fmadd(w, xv, q[j % 2]);
                s[j % 2] = s[j % 2].add(xv);
            }
            let (d, m) = group_dm(sc_row, supers, gps, g);
            total = L::fmadd(L::splat(d), q[0].add(q[1]), total);
            total = L::fmadd(L::splat(-m), s[0].add(s[1]), total);
        }
        total.hsum()
    }
}
