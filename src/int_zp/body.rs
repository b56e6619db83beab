//! The group loop of the x86 bodies of `dot::dot_row` (`avx2.rs`,
//! `avx512.rs`), generic over the f32 register type and the code width;
//! each ISA file brings only its widening of one run of codes.

use super::{half, Row, RUN};
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
            // Four independent chains (two per run, even and odd runs apart),
            // so the FMA latency does not bound the loop. A macro, not a
            // closure: a closure here would not inherit the caller's target
            // features, and its intrinsics would not inline.
            macro_rules! step {
                ($run:expr, $q:ident, $sx:ident) => {
                    let run = $run;
                    for (j, w) in widen(pb.add(run * run_bytes)).into_iter().enumerate() {
                        let xv = L::load(px.add(run * RUN + j * L::LANES));
                        $q[j % 2] = L::fmadd(w, xv, $q[j % 2]);
                        $sx[j % 2] = $sx[j % 2].add(xv);
                    }
                };
            }
            let z2 = [L::zero(); 2];
            let (mut qa, mut sa, mut qb, mut sb) = (z2, z2, z2, z2);
            let (mut run, last) = (start / RUN, end / RUN);
            while run + 2 <= last {
                step!(run, qa, sa);
                step!(run + 1, qb, sb);
                run += 2;
            }
            if run < last {
                step!(run, qa, sa);
            }
            let zx = sa[0].add(sa[1]).add(sb[0].add(sb[1]));
            let zx = zx.mul(L::splat(f32::from(z)));
            let q = qa[0].add(qa[1]).add(qb[0].add(qb[1]));
            total = L::fmadd(L::splat(half(s)), q.sub(zx), total);
        }
        total.hsum()
    }
}
