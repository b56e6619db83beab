//! The AVX2 forward of the 4-bit nibble formats (`int4_asym`, `int4_k`,
//! 4-bit `int_zp`) at batches of 1 to 3: for each row of `x`, the multi-row
//! dot of `rows_avx2.rs` over tasks of output rows, with `x`'s per-group
//! sums formed once per call.
//!
//! Why its own driver (Zen 3, `perf record -e cpu-clock` of a loop of
//! batch-1 calls, docs/benchmarks.md): through the shared row engine
//! (`crate::linear::kernels`) each task of up to 64 rows called the
//! multi-row dot afresh, which summed all of `x` per group again and
//! allocated its buffers on the heap, and the engine's per-output epilogue
//! (a scale closure, a bias closure) ran around it; together a tenth of a
//! small layer's call. Here the sums are made before the tasks, the rows'
//! `(d, c)` slots live on the stack, and each output is `dot + bias`.
//!
//! The task split is the engine's (about 64 Ki weights per task, a multiple
//! of the kernel's four rows, at most 64 rows), run by
//! `crate::par::for_each_block`; each output is summed by one task in a
//! fixed order, so the result does not depend on the thread count, and it
//! is the engine's value for the same rows bit for bit (the same dot, then
//! `+ bias`, where the engine's `* 1.0` changes nothing).

use super::rows_avx2::{dot_rows_with, x_sums, GroupScales};
use super::RUN;
use crate::linear::dispatch::Dots;
use crate::simd::Avx2;

/// The largest batch this driver serves (from 4 the register-tiled batch
/// kernel, `batch_avx2.rs`, reuses each decoded weight across batch rows).
pub(crate) const MAX_BATCH: usize = 3;
/// Output rows per task, at most (a multiple of the kernel's 4 rows).
const TASK_ROWS: usize = 64;

/// `y[b, r] = row r . x[b] (+ bias[r])` for `x [m, in]` (`m <= MAX_BATCH`),
/// `y [m, out]`, the rows' codes `codes` (`[out, in / 2]`, runs of 16
/// bytes) and multipliers `s`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matvec<S: GroupScales + Sync + ?Sized>(
    t: Avx2,
    dots: Dots,
    s: &S,
    codes: &[u8],
    [n, k]: [usize; 2],
    x: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let m = x.len() / k.max(1);
    assert!(k > 0 && k.is_multiple_of(RUN) && x.len() == m * k && y.len() == m * n);
    assert!(m <= MAX_BATCH && codes.len() == n * (k / 2) && bias.is_none_or(|b| b.len() == n));
    let group_runs = s.group_runs();
    let sums: Vec<Vec<f32>> = x
        .chunks_exact(k)
        .map(|xb| x_sums(t, xb, group_runs))
        .collect();
    let task = ((1 << 16) / k + 1).next_multiple_of(4).min(TASK_ROWS);
    let out = Out(y.as_mut_ptr());
    crate::par::for_each_block(n.div_ceil(task), |c| {
        let rows = c * task..((c + 1) * task).min(n);
        let mut v = [0f32; TASK_ROWS];
        let v = &mut v[..rows.len()];
        for (b, (xb, xsum)) in x.chunks_exact(k).zip(&sums).enumerate() {
            dot_rows_with(t, dots, s, codes, rows.start, xb, xsum, v);
            for (r, &vr) in rows.clone().zip(v.iter()) {
                let o = out;
                // SAFETY: element (b, r) is written by the task owning r
                // only, and b * n + r < m * n = y.len().
                unsafe { *o.0.add(b * n + r) = vr + bias.map_or(0.0, |bb| bb[r]) };
            }
        }
    });
}

/// `y`'s pointer, shared by the tasks (each writes only its own rows).
#[derive(Clone, Copy)]
pub(super) struct Out(pub(super) *mut f32);
// SAFETY: the tasks write disjoint elements (their own output rows).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}
