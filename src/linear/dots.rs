//! The dot products that the AVX2 and AVX-512 files share, written once over
//! [`F32Lanes`] and instantiated by each file's `#[target_feature]`
//! functions (which take the proof token). Each keeps the operations and
//! their order of the kernel it replaced, so each level gives the same bits
//! as before; the levels differ from each other (and from the scalar twins)
//! only in the order of the f32 additions.

use super::format::dot_i8_scalar;
use crate::simd::F32Lanes;

/// `a . b`: two chains of FMAs over `2 * LANES` elements a step, their sum
/// reduced, then the tail in order with `mul_add`.
///
/// # Safety
/// The CPU must have `L`'s instruction set (see [`F32Lanes`]).
#[inline(always)]
pub(super) unsafe fn dot_f32<L: F32Lanes>(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let step = 2 * L::LANES;
    let n = a.len() / step * step;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    // SAFETY: (every block) the caller guarantees the instruction set; every
    // load reads below i + step <= n <= a.len() == b.len().
    let (mut s0, mut s1) = unsafe { (L::zero(), L::zero()) };
    let mut i = 0;
    while i < n {
        // SAFETY: see above.
        unsafe {
            s0 = L::fmadd(L::load(pa.add(i)), L::load(pb.add(i)), s0);
            s1 = L::fmadd(
                L::load(pa.add(i + L::LANES)),
                L::load(pb.add(i + L::LANES)),
                s1,
            );
        }
        i += step;
    }
    // SAFETY: see above.
    let mut t = unsafe { L::add(s0, s1).hsum() };
    for j in n..a.len() {
        t = a[j].mul_add(b[j], t);
    }
    t
}

/// `q . x` for int8 `q`: one chain of FMAs over `LANES` elements a step,
/// reduced, plus the scalar twin on the tail.
///
/// # Safety
/// The CPU must have `L`'s instruction set (see [`F32Lanes`]).
#[inline(always)]
pub(super) unsafe fn dot_i8<L: F32Lanes>(q: &[i8], x: &[f32]) -> f32 {
    assert_eq!(q.len(), x.len());
    let n = q.len() / L::LANES * L::LANES;
    let (pq, px) = (q.as_ptr(), x.as_ptr());
    // SAFETY: (every block) the caller guarantees the instruction set; every
    // load reads below i + LANES <= n <= q.len() == x.len().
    let mut s = unsafe { L::zero() };
    let mut i = 0;
    while i < n {
        // SAFETY: see above.
        unsafe { s = L::fmadd(L::load_i8(pq.add(i)), L::load(px.add(i)), s) };
        i += L::LANES;
    }
    // SAFETY: see above.
    unsafe { s.hsum() + dot_i8_scalar(&q[n..], &x[n..]) }
}

/// `part[i][j] = xs[i] . ws[j]`: 16 accumulators, each reduced, then its
/// tail in order with `mul_add`.
///
/// # Safety
/// The CPU must have `L`'s instruction set (see [`F32Lanes`]).
#[inline(always)]
pub(super) unsafe fn dot4x4<L: F32Lanes>(
    xs: &[&[f32]; 4],
    ws: &[&[f32]; 4],
    part: &mut [[f32; 4]; 4],
) {
    assert!(xs.iter().chain(ws).all(|s| s.len() == xs[0].len()));
    let len = xs[0].len();
    let n = len / L::LANES * L::LANES;
    // SAFETY: (every block) the caller guarantees the instruction set; every
    // load reads below i + LANES <= n <= len, the length of all eight slices
    // (asserted).
    let mut acc = [[unsafe { L::zero() }; 4]; 4];
    let mut i = 0;
    while i < n {
        // SAFETY: see above.
        unsafe {
            let xv: [L; 4] = std::array::from_fn(|r| L::load(xs[r].as_ptr().add(i)));
            let wv: [L; 4] = std::array::from_fn(|c| L::load(ws[c].as_ptr().add(i)));
            for r in 0..4 {
                for c in 0..4 {
                    acc[r][c] = L::fmadd(xv[r], wv[c], acc[r][c]);
                }
            }
        }
        i += L::LANES;
    }
    for r in 0..4 {
        for c in 0..4 {
            // SAFETY: see above.
            let mut t = unsafe { acc[r][c].hsum() };
            for j in n..len {
                t = xs[r][j].mul_add(ws[c][j], t);
            }
            part[r][c] = t;
        }
    }
}
