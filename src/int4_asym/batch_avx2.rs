//! The AVX2 forward of the 4-bit nibble formats (`int4_asym`, `int4_k` and
//! 4-bit `int_zp`: runs of 32 inputs in 16 bytes, per group `w = d q + c`,
//! `rows_avx2::GroupScales`) at batches of 4 to [`MAX_BATCH`]; [`matmul`]
//! hands batches of 1 to 3 to the batch-1 driver (`matvec_avx2.rs`).
//!
//! Why (Zen 3, one thread, docs/benchmarks.md): there the shared row
//! engine decodes each tile of 16 rows x 512 inputs to float32, then runs
//! its 4 x 4 dot tiles over it; with the decode in SIMD (`runs.rs`) the
//! tile GEMM alone still took about 1.5 times INT4 g32's whole call at
//! batch 16. Here the weights never leave the registers: each run of 32
//! codes is widened and scaled into four vectors (`fma(q, d, c)`, one
//! rounding per weight, as the decoded tile has), which then meet up to
//! [`B`] batch rows of `x` (`B` accumulators, one FMA per loaded vector
//! of `x`). `x` is walked in blocks of [`KB`] inputs so that the `B`
//! rows' slice of it stays in L1d while a task's output rows stream by.
//!
//! Rounding: per output, the weights rounded once each (as the decoded
//! tile), then the sum of `w x` in eight f32 lanes per block of [`KB`]
//! inputs, the blocks added in order: within `(in + 3) * eps_f32 *
//! sum_i |w_i x_i|` (+ the weights' own rounding) of the exact value.
//! Each output is summed by one task, in the same order at every thread
//! count.

use std::arch::x86_64::*;

use super::matvec_avx2::Out;
use super::rows_avx2::GroupScales;
use super::RUN;
use crate::linear::dispatch::Dots;
use crate::simd::{Avx2, F32Lanes};

/// The smallest batch [`matmul`] serves: batches of 1 to
/// `matvec_avx2::MAX_BATCH` go to the batch-1 driver (`matvec_avx2.rs`,
/// the several-rows-per-pass dot, which reads the weight once per batch
/// row and is cheaper there than the accumulators' reduction here).
pub(crate) const MIN_BATCH: usize = 1;
/// The largest batch this kernel serves (from 32 the engine's panel GEMM
/// reuses each decoded weight across more batch rows than this kernel's
/// registers hold).
pub(crate) const MAX_BATCH: usize = 31;
/// Batch rows per pass: one accumulator each, with the four decoded
/// vectors, `d`, `c` and the nibble mask, 15 of the 16 ymm registers.
const B: usize = 8;
/// Inputs per block of `x`: `B` rows of 512 floats are 16 KiB, in L1d.
const KB: usize = 512;
/// Output rows per task (one rayon task at most).
const ROWS_PER_TASK: usize = 16;

/// `y[b, r] = row r . x[b] (+ bias[r])` for `x [m, in]`, `y [m, out]`, the
/// rows' codes `codes` (`[out, in / 2]`, runs of 16 bytes) and multipliers
/// `s` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul<S: GroupScales + Sync + ?Sized>(
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
    if m <= super::matvec_avx2::MAX_BATCH {
        return super::matvec_avx2::matvec(t, dots, s, codes, [n, k], x, bias, y);
    }
    assert!(k > 0 && k.is_multiple_of(RUN) && x.len() == m * k && y.len() == m * n);
    assert!(codes.len() == n * (k / 2) && bias.is_none_or(|b| b.len() == n));
    let group_runs = s.group_runs();
    assert!(group_runs > 0);
    let groups = (k / RUN).div_ceil(group_runs);
    let out = Out(y.as_mut_ptr());
    crate::par::for_each_block(n.div_ceil(ROWS_PER_TASK), |blk| {
        let rows = blk * ROWS_PER_TASK..((blk + 1) * ROWS_PER_TASK).min(n);
        let mut dm = vec![0f32; rows.len() * 2 * groups];
        for (r, d) in rows.clone().zip(dm.chunks_exact_mut(2 * groups)) {
            s.group_scales(dots, r, d);
        }
        let mut acc = vec![0f32; rows.len() * m];
        for k0 in (0..k).step_by(KB) {
            let runs = k0 / RUN..(k0 + KB).min(k) / RUN;
            for (i, r) in rows.clone().enumerate() {
                let row = Row {
                    codes: &codes[r * (k / 2)..(r + 1) * (k / 2)],
                    dm: &dm[i * 2 * groups..(i + 1) * 2 * groups],
                    group_runs,
                };
                let sums = &mut acc[i * m..(i + 1) * m];
                for b0 in (0..m).step_by(B) {
                    let xs = &x[b0 * k..];
                    let o = &mut sums[b0..(b0 + B).min(m)];
                    // SAFETY: the token proves AVX2 and FMA; `runs` lies in
                    // the row (`k / 32` runs, `groups` pairs) and `xs` holds
                    // `o.len()` rows of `k` (asserted above).
                    unsafe {
                        match o.len() {
                            8 => add(o, &block::<8>(t, row, xs, k, runs.clone())),
                            7 => add(o, &block::<7>(t, row, xs, k, runs.clone())),
                            6 => add(o, &block::<6>(t, row, xs, k, runs.clone())),
                            5 => add(o, &block::<5>(t, row, xs, k, runs.clone())),
                            4 => add(o, &block::<4>(t, row, xs, k, runs.clone())),
                            3 => add(o, &block::<3>(t, row, xs, k, runs.clone())),
                            2 => add(o, &block::<2>(t, row, xs, k, runs.clone())),
                            _ => add(o, &block::<1>(t, row, xs, k, runs.clone())),
                        }
                    }
                }
            }
        }
        for (i, r) in rows.clone().enumerate() {
            let b_r = bias.map_or(0.0, |b| b[r]);
            for b in 0..m {
                let o = out;
                // SAFETY: rows `rows` belong to this task only, and
                // `b * n + r < m * n = y.len()`.
                unsafe { *o.0.add(b * n + r) = acc[i * m + b] + b_r };
            }
        }
    });
}

fn add(o: &mut [f32], v: &[f32]) {
    o.iter_mut().zip(v).for_each(|(a, b)| *a += b);
}

/// One output row: its code bytes and `(d, c)` pairs.
#[derive(Clone, Copy)]
struct Row<'a> {
    codes: &'a [u8],
    dm: &'a [f32],
    group_runs: usize,
}

/// The sums over runs `runs` of the row against `BB` rows of `x` (row `b`
/// at `x[b * k..]`).
///
/// # Safety
/// None beyond the token (AVX2 and FMA); `runs.end <= k / 32`, the row has
/// `k / 2` code bytes and a pair per group, `x` has `BB` rows of `k`.
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const BB: usize>(
    _: Avx2,
    row: Row<'_>,
    x: &[f32],
    k: usize,
    runs: std::ops::Range<usize>,
) -> [f32; BB] {
    debug_assert!(runs.end * RUN <= k && x.len() >= (BB - 1) * k + runs.end * RUN);
    let (pc, pdm, px) = (row.codes.as_ptr(), row.dm.as_ptr(), x.as_ptr());
    let mask = _mm256_set1_epi32(0x0F);
    let mut acc = [_mm256_setzero_ps(); BB];
    let mut g = runs.start / row.group_runs;
    let mut next = (g + 1) * row.group_runs;
    // SAFETY: every run read is below `runs.end` (the contract), its group
    // below the row's groups; each `x` load is inside row `b < BB`.
    unsafe {
        let (mut d, mut c) = (
            _mm256_broadcast_ss(&*pdm.add(2 * g)),
            _mm256_broadcast_ss(&*pdm.add(2 * g + 1)),
        );
        for run in runs {
            if run == next {
                g += 1;
                next += row.group_runs;
                d = _mm256_broadcast_ss(&*pdm.add(2 * g));
                c = _mm256_broadcast_ss(&*pdm.add(2 * g + 1));
            }
            let p = pc.add(run * RUN / 2);
            let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            let w = [
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, mask)), d, c),
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, mask)), d, c),
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v0)), d, c),
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v1)), d, c),
            ];
            for (b, a) in acc.iter_mut().enumerate() {
                let xr = px.add(b * k + run * RUN);
                for (j, wj) in w.iter().enumerate() {
                    *a = _mm256_fmadd_ps(*wj, _mm256_loadu_ps(xr.add(8 * j)), *a);
                }
            }
        }
        acc.map(|a| a.hsum())
    }
}
