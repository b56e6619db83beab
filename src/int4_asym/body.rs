//! The group loop of the AVX-512 body of `dot::dot_row` (`avx512.rs`),
//! generic over the f32 register type (the AVX2 level runs the multi-row
//! kernel of `rows_avx2.rs` instead).

use super::{half, RUN};
use crate::simd::F32Lanes;

/// The group loop of the AVX-512 body, over any f32 register type `L`:
/// `widen(p)` turns the 16 bytes at `p` (one run of 32 codes) into `V`
/// vectors of f32 codes, vector `j` covering inputs `8j..` (AVX2) or
/// `16j..` (AVX-512) of the run; vector `j` multiply-adds into accumulator
/// `j % 2`, and `x` is summed alongside for the minimum's term.
///
/// # Safety
/// The caller's target features cover `L`'s intrinsics and `widen`'s, and
/// `dot::dot_row`'s length checks hold (`x.len() == 2 * codes.len()`, a
/// multiple of 32, one `(d, m)` pair per group, `group_size` a multiple
/// of 32); `V * L::LANES == 32`.
#[inline(always)]
pub(super) unsafe fn dot_row_body<L: F32Lanes, const V: usize>(
    codes: &[u8],
    scales: &[u16],
    group_size: usize,
    x: &[f32],
    widen: impl Fn(*const u8) -> [L; V],
) -> f32 {
    debug_assert_eq!(V * L::LANES, RUN);
    let (pb, px) = (codes.as_ptr(), x.as_ptr());
    // SAFETY: every pointer is inside `codes` / `x` by the length checks
    // above; the features are the caller's.
    unsafe {
        let mut total = L::zero();
        for (g, dm) in scales.chunks_exact(2).enumerate() {
            let (start, end) = (g * group_size, ((g + 1) * group_size).min(x.len()));
            let (mut q, mut s) = ([L::zero(); 2], [L::zero(); 2]);
            let mut i = start;
            while i < end {
                for (j, w) in widen(pb.add(i / 2)).into_iter().enumerate() {
                    let xv = L::load(px.add(i + j * L::LANES));
                    q[j % 2] = L::fmadd(w, xv, q[j % 2]);
                    s[j % 2] = s[j % 2].add(xv);
                }
                i += RUN;
            }
            total = L::fmadd(L::splat(half(dm[0])), q[0].add(q[1]), total);
            total = L::fmadd(L::splat(half(dm[1])), s[0].add(s[1]), total);
        }
        total.hsum()
    }
}
