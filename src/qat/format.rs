//! The fused AdamW + fake-quantization passes of one optimizer step over
//! one task's range: the scalar twin, a leaf with no `unsafe` (`x86.rs`
//! compiles the same bodies for AVX2 and AVX-512).
//!
//! A step is two passes so that it can fail without changing anything:
//! - [`dry_body`] computes every updated weight in registers and reduces
//!   min, max and a non-finite flag, writing nothing;
//! - after calibration succeeded, [`commit_body`] recomputes the same
//!   values (the same operations in the same order, so bit-identical),
//!   writes master, moments and the fake-quantized view in one sweep.
//!
//! The element math is one `#[inline(always)]` function compiled three
//! times: plain, and inside `#[target_feature]` wrappers for AVX2+FMA and
//! AVX-512, where LLVM vectorizes it. No fast-math flags are involved, so
//! every build computes bit-identical results (FMA is never contracted), and
//! the values do not depend on the SIMD level or the thread count.

use super::element::{zero_if_finite, Master};
use super::fake::{fake_fp8_chunk, fake_int_chunk, IntGrid, Rounding};
use crate::fp8::Fp8Format;

/// Per-step AdamW constants, in the master's precision.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coef<T> {
    pub(crate) lr: T,
    pub(crate) lrwd: T,
    pub(crate) b1: T,
    pub(crate) b2: T,
    pub(crate) omb1: T,
    pub(crate) omb2: T,
    pub(crate) bc1: T,
    pub(crate) bc2: T,
    pub(crate) eps: T,
}

impl<T: Master> Coef<T> {
    /// Constants for step `t` (1-based), computed in f64 like Python floats.
    pub(crate) fn new(lr: f64, b1: f64, b2: f64, eps: f64, wd: f64, t: u64) -> Coef<T> {
        let f = T::from_f64;
        Coef {
            lr: f(lr),
            lrwd: f(lr * wd),
            b1: f(b1),
            b2: f(b2),
            omb1: f(1.0 - b1),
            omb2: f(1.0 - b2),
            bc1: f(1.0 - b1.powf(t as f64)),
            bc2: f(1.0 - b2.powf(t as f64)),
            eps: f(eps),
        }
    }
}

/// One AdamW element update, PyTorch order: decoupled decay on the old
/// weight, then the bias-corrected Adam step. Returns `(w, m, v)`.
#[inline(always)]
fn adamw<T: Master>(w: T, g: T, m: T, v: T, c: &Coef<T>) -> (T, T, T) {
    let m = c.b1 * m + c.omb1 * g;
    let v = c.b2 * v + c.omb2 * (g * g);
    let w = w - c.lrwd * w;
    let mhat = m / c.bc1;
    let vhat = v / c.bc2;
    (w - c.lr * mhat / (vhat.sqrt() + c.eps), m, v)
}

/// What the dry pass learns about the updated master.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Stats {
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// Some updated weight or moment is NaN or infinite.
    pub(crate) non_finite: bool,
}

impl Stats {
    pub(crate) const EMPTY: Stats = Stats {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        non_finite: false,
    };

    pub(crate) fn merge(a: Stats, b: Stats) -> Stats {
        Stats {
            min: a.min.min(b.min),
            max: a.max.max(b.max),
            non_finite: a.non_finite || b.non_finite,
        }
    }
}

/// Elements per inner piece of a task: everything it touches stays in L1.
const PIECE: usize = 1024;

const LANES: usize = 16;

/// Min, max and the non-finite flag of `buf`, in `LANES` independent lanes
/// (a shape the compiler turns into vector min / max / add).
#[inline(always)]
fn reduce<T: Master>(buf: &[T], s: &mut Stats) {
    let mut mn = [T::INF; LANES];
    let mut mx = [T::ZERO - T::INF; LANES];
    // Sum of `x - x`: 0 while everything is finite, NaN once anything is not.
    let mut bad = [T::ZERO; LANES];
    let body = buf.len() / LANES * LANES;
    for c in buf[..body].chunks_exact(LANES) {
        for l in 0..LANES {
            mn[l] = if c[l] < mn[l] { c[l] } else { mn[l] };
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
            bad[l] = bad[l] + zero_if_finite(c[l]);
        }
    }
    for &x in &buf[body..] {
        mn[0] = if x < mn[0] { x } else { mn[0] };
        mx[0] = if x > mx[0] { x } else { mx[0] };
        bad[0] = bad[0] + zero_if_finite(x);
    }
    for l in 0..LANES {
        s.min = s.min.min(mn[l].into());
        s.max = s.max.max(mx[l].into());
        s.non_finite |= bad[l].into() != 0.0;
    }
}

/// Dry pass over one task's range: the updated weights of each piece go to
/// an L1-resident buffer (an element-wise loop, vectorized), then get reduced.
/// A non-finite moment poisons its weight's slot (`w + (m - m) + (v - v)` is
/// `w` while both are finite, since only the sign of a zero can change, and
/// min / max only feed `|x|` and `min(x, 0)`), so one flag covers all three.
#[inline(always)]
pub(crate) fn dry_body<T: Master>(w: &[T], g: &[T], m: &[T], v: &[T], c: &Coef<T>) -> Stats {
    let mut s = Stats::EMPTY;
    let mut buf = [T::ZERO; PIECE];
    let mut start = 0;
    while start < w.len() {
        let end = (start + PIECE).min(w.len());
        let out = &mut buf[..end - start];
        let elems = w[start..end]
            .iter()
            .zip(&g[start..end])
            .zip(m[start..end].iter().zip(&v[start..end]));
        for (o, ((&w, &g), (&m, &v))) in out.iter_mut().zip(elems) {
            let (nw, nm, nv) = adamw(w, g, m, v, c);
            *o = nw + zero_if_finite(nm) + zero_if_finite(nv);
        }
        reduce(out, &mut s);
        start = end;
    }
    s
}

/// How the commit pass fills the quantized view.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Quantizer {
    Int(IntGrid),
    Fp8(Fp8Format),
    /// The pass leaves the view alone: a deploy grid derives it afterwards
    /// from the whole updated master (`deploy::fill_view`).
    Later,
}

/// What every task of one commit pass shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CommitStep<'a, T> {
    pub(crate) coef: &'a Coef<T>,
    pub(crate) quant: Quantizer,
    pub(crate) rounding: Rounding,
}

/// One task's buffers for the commit pass: master, gradient, moments and
/// view of the elements from global index `offset` on.
pub(crate) struct CommitChunk<'a, T> {
    pub(crate) w: &'a mut [T],
    pub(crate) g: &'a [T],
    pub(crate) m: &'a mut [T],
    pub(crate) v: &'a mut [T],
    pub(crate) q: &'a mut [T],
    pub(crate) offset: usize,
}

/// Commit pass over one task's range: the AdamW update of each piece in
/// place, then its fake-quantized view.
#[inline(always)]
pub(crate) fn commit_body<T: Master>(s: CommitStep<'_, T>, x: CommitChunk<'_, T>) {
    let CommitChunk {
        w,
        g,
        m,
        v,
        q,
        offset,
    } = x;
    let (c, quant, r) = (s.coef, s.quant, s.rounding);
    let mut start = 0;
    while start < w.len() {
        let end = (start + PIECE).min(w.len());
        let (w, q) = (&mut w[start..end], &mut q[start..end]);
        let elems = w
            .iter_mut()
            .zip(&g[start..end])
            .zip(m[start..end].iter_mut().zip(v[start..end].iter_mut()));
        for ((w, &g), (m, v)) in elems {
            (*w, *m, *v) = adamw(*w, g, *m, *v, c);
        }
        match quant {
            Quantizer::Int(grid) => fake_int_chunk(w, q, &grid, r, offset + start),
            Quantizer::Fp8(fmt) => fake_fp8_chunk(w, q, fmt, r, offset + start),
            Quantizer::Later => {}
        }
        start = end;
    }
}
