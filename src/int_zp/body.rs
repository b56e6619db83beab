//! The group loop of the x86 bodies of `dot::dot_row` (`avx2.rs`,
//! `avx512.rs`), generic over the f32 register type and the code width;
//! each ISA file brings only its widening of one run of codes.

use super::dot::Row;
use super::{half, RUN};
use crate::simd::F32Lanes;

/// The group loop over any f32 register type `L`: `widen(p)` turns the run
/// of 32 codes at `p` (`row.run_bytes()` bytes) into `V` vectors of f32
/// codes, vector `j` covering inputs `j * L::LANES ..` of the run; vector
/// `j` multiply-adds into one of four accumulators, and `x` is summed alongside
/// for the zero point's term.
///
/// # Safety
/// The caller's target features cover `L`'s intrinsics and `widen`'s, and
/// `dot::dot_row`'s length checks hold; `V * L::LANES == 32`.
#[inline(always)]
pub(super) unsafe fn group_loop<L: F32Lanes, const V: usize>(
    row: Row<'_>,
    x: &[f32],
    widen: impl Fn(*const u8) -> [L; V],
) -> f32 {
    debug_assert_eq!(V * L::LANES, RUN);
    let (pb, px, run_bytes) = (row.codes.as_ptr(), x.as_ptr(), row.run_bytes());
    // SAFETY: every run read is inside `row.codes` and every load inside
    // `x` by `dot_row`'s length checks; the features are the caller's.
    unsafe {
        let mut total = L::zero();
        for (g, (&s, &z)) in row.scales.iter().zip(row.zeros).enumerate() {
            let (start, end) = (g * row.group_size, ((g + 1) * row.group_size).min(x.len()));
            // Four independent chains (vector j of run r feeds chain
            // `(r V + j) % 4`), so the FMA latency does not bound the loop.
            let (mut q, mut sx) = ([L::zero(); 4], [L::zero(); 4]);
            for run in start / RUN..end / RUN {
                let codes = widen(pb.add(run * run_bytes));
                for (j, w) in codes.into_iter().enumerate() {
                    let c = (run * V + j) % 4;
                    let xv = L::load(px.add(run * RUN + j * L::LANES));
                    q[c] = L::fmadd(w, xv, q[c]);
                    sx[c] = sx[c].add(xv);
                }
            }
            let sum = |v: [L; 4]| v[0].add(v[1]).add(v[2].add(v[3]));
            let zx = sum(sx).mul(L::splat(f32::from(z)));
            total = L::fmadd(L::splat(half(s)), sum(q).sub(zx), total);
        }
        total.hsum()
    }
}
