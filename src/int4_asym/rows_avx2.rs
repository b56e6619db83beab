//! The AVX2 row dot that the three 4-bit nibble formats share (`int4_asym`,
//! `int4_k`, 4-bit `int_zp`): each stores each run of 32 inputs of an
//! output row as 16 bytes (input `j` in byte `j`'s low nibble, input
//! `j + 16` in its high nibble) and each row's dot is, per group `g` of
//! runs, `d_g * sum(q x) + c_g * sum(x)` (`c = m` for `int4_asym`, `-m`
//! for `int4_k`, `-(s z)` for `int_zp`). Only the reading of `(d_g, c_g)`
//! differs: each format brings a [`GroupScales`] that writes them as f32
//! pairs, once per row and call, into a slot on the stack (and prefetches
//! the next pass's scales).
//!
//! Why this shape (measured on Zen 3, docs/benchmarks.md): the per-row body
//! it replaces widened every code through 128-bit shuffles, summed `x` again
//! for every row and chained two FMAs per group into one accumulator, which
//! held it to 0.15-0.3 of INT4 g32's bytes per second. Here
//! - `sum(x)` per group is computed once per call (per row of `x`: the
//!   batch-1 driver, `matvec_avx2.rs`, sums it before its tasks), not per
//!   row;
//! - [`ROWS`] output rows share each load of `x` (one pass over a run of
//!   32 reads `x` once and the four rows' 64 bytes);
//! - the decode is two zero-extending loads of 8 bytes (`vpmovzxbd` from
//!   memory) per run, an `and` for the low nibbles and a shift for the high
//!   ones: no shuffles beyond the loads' own;
//! - the group's scale is one broadcast and one FMA per row, and the
//!   minima's term `sum_g c_g sum(x)_g` one short contiguous dot per row
//!   after the groups (pairs `(d, c)` against pairs `(0, sum(x))`);
//! - groups of one run (`int4_k`, `int4_asym` g32) compile to their own
//!   loop, without the loop over a group's runs.
//!
//! Why the `(d, c)` pairs are prepared per row rather than read inside the
//! group loop: at groups of 32 the loop's work per row and run is about 16
//! vector operations; a half-to-float conversion there (`vpbroadcastw`,
//! `vcvtph2ps`) would add two or three per group, about what converting
//! the row's halves eight at a time costs per group, and the minima's
//! term would need the conversion again. The preparation's measured cost
//! was in its surroundings (a heap allocation and a fill per task, `memset`
//! calls for the padding, the scale loads' L2 misses, `int4_k`'s copies of
//! its last codes), which the stack slots, the fixed-length padding and
//! [`GroupScales::prefetch_scales`] avoid (docs/benchmarks.md, "batch-1
//! driver and register budget").
//!
//! Rounding: per group, `sum(q x)` in one f32 chain per lane (the group's
//! runs in order), one FMA with `d_g` into the row's eight lanes, the
//! minima's term added into the same lanes (`sum(x)` per group as eight
//! f32 lanes then a horizontal sum), then one horizontal sum; so the
//! result is within `(in + 3) * eps_f32 * sum_i (|d q_i| + |c|)
//! |x_i|` of the exact value, the bound of the per-format scalar twins.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::RUN;
use crate::linear::dispatch::Dots;
use crate::simd::{Avx2, F32Lanes};

/// Output rows one pass of the kernel serves (registers: see `kernel`).
const ROWS: usize = 4;

/// Bytes ahead along each row that the kernel prefetches in rows of at
/// least this many bytes (INT4's distance, `crate::int4`'s strips).
const PREFETCH_AHEAD: usize = 512;

/// A format's per-group multipliers.
pub(crate) trait GroupScales {
    /// Runs of 32 inputs per group (the last group may have fewer).
    fn group_runs(&self) -> usize;

    /// Write row `r`'s `(d_g, c_g)` as f32 pairs, `dm[2g]`, `dm[2g + 1]`,
    /// for every group `g` of the row (`dm.len()` is twice the groups).
    /// `dots` is the level in force (an F16C token converts halves).
    fn group_scales(&self, dots: Dots, r: usize, dm: &mut [f32]);

    /// [`GroupScales::group_scales`] into the first `pairs` floats (twice
    /// the groups) of `dm`, a row's slot padded to a multiple of 8 floats
    /// whose padding is zero on entry and must be zero on return. A format
    /// whose conversion runs 8 floats at a time can convert the whole slot
    /// (reading into the next row's scales) instead of ending each row on
    /// a short tail, then zero the padding.
    fn group_scales_padded(&self, dots: Dots, r: usize, pairs: usize, dm: &mut [f32]) {
        self.group_scales(dots, r, &mut dm[..pairs]);
    }

    /// Ask the caches for the scales of rows `rows` (the next pass's,
    /// [`prefetch_elems`]): a row's scales are read once per call, first
    /// by [`GroupScales::group_scales_padded`], whose loads otherwise wait
    /// on L2 misses between the passes. The default fetches nothing.
    fn prefetch_scales(&self, rows: std::ops::Range<usize>) {
        let _ = rows;
    }
}

/// Prefetch (into L1) the cache lines of `s[from..to]`, clipped to `s`.
pub(crate) fn prefetch_elems<T>(s: &[T], from: usize, to: usize) {
    let to = to.min(s.len());
    if from >= to {
        return;
    }
    let (first, last) = (
        s[from..].as_ptr().cast::<u8>(),
        s[to - 1..].as_ptr().cast::<u8>(),
    );
    let mut p = first;
    while p <= last {
        // SAFETY: a prefetch never faults; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) };
        p = p.wrapping_add(64);
    }
    // SAFETY: as above (the line of the last element, where the walk in
    // steps of 64 from an unaligned start skipped it).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(last.cast()) };
}

/// `out[i] = row (r0 + i) . x` for the rows of `codes` (`in / 2` bytes
/// each, `x.len() == in`, a multiple of 32) whose scales `s` reads.
pub(crate) fn dot_rows<S: GroupScales + ?Sized>(
    t: Avx2,
    dots: Dots,
    s: &S,
    codes: &[u8],
    r0: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let xsum = x_sums(t, x, s.group_runs());
    dot_rows_with(t, dots, s, codes, r0, x, &xsum, out);
}

/// `(0, sum(x))` per group of `group_runs` runs of `x` (a multiple of 32
/// floats; the last group may be shorter), then zeros to a multiple of 8
/// floats: the `xsum` of [`dot_rows_with`], once per call and row of `x`.
pub(crate) fn x_sums(t: Avx2, x: &[f32], group_runs: usize) -> Vec<f32> {
    assert!(x.len().is_multiple_of(RUN) && group_runs > 0);
    let pairs = 2 * (x.len() / RUN).div_ceil(group_runs);
    let mut xsum = vec![0f32; pairs.next_multiple_of(8)];
    // SAFETY: the token proves AVX2 and FMA; `xsum` has one pair per group
    // of `x`.
    unsafe { group_sums(t, x, group_runs, &mut xsum[..pairs]) };
    xsum
}

/// Floats of `(d, c)` slots that [`dot_rows_with`] keeps on the stack (a
/// pass's four rows of up to 128 groups: 4 KiB); longer rows take a heap
/// buffer.
const STACK_FLOATS: usize = 1024;

/// [`dot_rows`] with `x`'s per-group sums given ([`x_sums`] of `x` and
/// `s.group_runs()`): the batch-1 driver (`matvec_avx2.rs`) sums `x` once
/// per call, not once per task of rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows_with<S: GroupScales + ?Sized>(
    t: Avx2,
    dots: Dots,
    s: &S,
    codes: &[u8],
    r0: usize,
    x: &[f32],
    xsum: &[f32],
    out: &mut [f32],
) {
    let in_feat = x.len();
    let runs = in_feat / RUN;
    let group_runs = s.group_runs();
    assert!(in_feat.is_multiple_of(RUN) && group_runs > 0);
    assert!(codes.len() >= (r0 + out.len()) * (in_feat / 2));
    let groups = runs.div_ceil(group_runs);
    // `(0, sum(x))` per group, beside each row's `(d, c)` pairs: the
    // minima's term of a row is then one contiguous dot of `2 * groups`.
    // Both padded with zeros to a multiple of 8 floats (`stride`), so that
    // dot has no scalar tail and the pairs convert 8 at a time.
    let pairs = 2 * groups;
    let stride = pairs.next_multiple_of(8);
    assert_eq!(xsum.len(), stride);
    // The rows' slots, zeros: on the stack where they fit (a heap
    // allocation per task was a visible share of a small layer's batch-1
    // call), only the floats used written (not all 4 KiB).
    let len = ROWS * stride;
    let mut stack = [MaybeUninit::<f32>::uninit(); STACK_FLOATS];
    let mut heap = Vec::new();
    let dm: &mut [f32] = if len <= STACK_FLOATS {
        stack[..len].iter_mut().for_each(|v| {
            v.write(0.0);
        });
        // SAFETY: the first `len` floats were written just above.
        unsafe { std::slice::from_raw_parts_mut(stack.as_mut_ptr().cast::<f32>(), len) }
    } else {
        heap.resize(len, 0f32);
        &mut heap
    };
    let row_bytes = in_feat / 2;
    // Prefetch distance along each row's codes: the same input of the next
    // pass's rows for short rows (a 576-input row is 288 bytes: 512 ahead
    // fell mostly inside the current pass), INT4's distance for long ones.
    let ahead = if row_bytes >= PREFETCH_AHEAD {
        PREFETCH_AHEAD
    } else {
        ROWS * row_bytes
    };
    for (b, o) in out.chunks_mut(ROWS).enumerate() {
        let first = r0 + b * ROWS;
        s.prefetch_scales(first + ROWS..first + 2 * ROWS);
        for (i, d) in dm.chunks_exact_mut(stride).take(o.len()).enumerate() {
            s.group_scales_padded(dots, first + i, pairs, d);
        }
        let at = |i: usize| Rows {
            codes: codes[(first + i) * row_bytes..].as_ptr(),
            dm: dm[i * stride..].as_ptr(),
        };
        let args = Args {
            x,
            xsum,
            group_runs,
            groups,
            ahead,
        };
        let mut v = [0f32; ROWS];
        // SAFETY: (every arm) the token proves the features; each row has
        // `in / 2` code bytes (asserted above) and `2 * groups` scales.
        unsafe {
            match (o.len(), group_runs) {
                (4, 1) => v = kernel::<4, true>(t, &args, [at(0), at(1), at(2), at(3)]),
                (4, _) => v = kernel::<4, false>(t, &args, [at(0), at(1), at(2), at(3)]),
                (3, _) => {
                    v[..3].copy_from_slice(&kernel::<3, false>(t, &args, [at(0), at(1), at(2)]))
                }
                (2, _) => v[..2].copy_from_slice(&kernel::<2, false>(t, &args, [at(0), at(1)])),
                _ => v[..1].copy_from_slice(&kernel::<1, false>(t, &args, [at(0)])),
            }
        }
        // A copy of a length known only at run time is a `memmove` call,
        // per pass of four rows: the full passes copy a fixed length.
        match <&mut [f32; ROWS]>::try_from(&mut *o) {
            Ok(o) => *o = v,
            Err(_) => o.copy_from_slice(&v[..o.len()]),
        }
    }
}

/// One row of a pass: its code bytes and its `(d, c)` pairs.
#[derive(Clone, Copy)]
struct Rows {
    codes: *const u8,
    dm: *const f32,
}

/// What every row of a pass shares.
struct Args<'a> {
    x: &'a [f32],
    /// `(0, sum(x))` per group, then zeros to a multiple of 8 floats.
    xsum: &'a [f32],
    group_runs: usize,
    groups: usize,
    /// Bytes ahead along each row that the kernel prefetches.
    ahead: usize,
}

/// `(0, sum(x))` of each group of `group_runs` runs (the last may be
/// shorter).
///
/// # Safety
/// None beyond the token (AVX2); `x.len()` is a multiple of 32 and `out`
/// has two slots per group (only the groups' slots are written).
#[target_feature(enable = "avx2,fma")]
unsafe fn group_sums(_: Avx2, x: &[f32], group_runs: usize, out: &mut [f32]) {
    for (xg, o) in x.chunks(group_runs * RUN).zip(out.chunks_exact_mut(2)) {
        // SAFETY: each run of 32 floats is inside `xg`; AVX2 is enabled.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            for run in xg.chunks_exact(RUN) {
                let p = run.as_ptr();
                let a = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
                let b = _mm256_add_ps(_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
                acc = _mm256_add_ps(acc, _mm256_add_ps(a, b));
            }
            o[1] = acc.hsum();
        }
    }
}

/// The dots of `R` rows (see the module docs); `ONE`: groups of one run
/// (`group_runs == 1`), the loop over a group's runs compiled away.
///
/// Registers: a run is walked in two halves of 8 bytes (bytes `8h..8h+8`:
/// inputs `8h..` in the low nibbles, `16 + 8h..` in the high ones), so
/// only two vectors of `x` are live at a time; each row carries its group
/// sum (every FMA of the group's runs in one chain per lane) and its
/// total, one FMA with `d_g` per group. With four rows that is 4 + 4 + 2
/// registers, the mask and the decoded codes: inside the 16 ymm registers.
/// The form before it (two code accumulators per row beside the total and
/// four vectors of `x`) kept two totals on the stack, each group's FMA
/// into them a store-to-load round trip (Zen 3, `perf annotate`: the
/// hottest instructions of a group-of-32 call); no closure reads the
/// totals either, which would also keep them in memory.
///
/// # Safety
/// None beyond the token (AVX2 and FMA); each row's `codes` holds
/// `x.len() / 2` bytes and its `dm` `xsum.len()` floats, `xsum` has one
/// pair per group of `group_runs` runs of `x` (`a.groups` of them) and
/// zeros after, which the rows' `dm` match.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize, const ONE: bool>(_: Avx2, a: &Args, rows: [Rows; R]) -> [f32; R] {
    let runs = a.x.len() / RUN;
    let groups = a.groups;
    let group_runs = if ONE { 1 } else { a.group_runs };
    let px = a.x.as_ptr();
    let mask = _mm256_set1_epi32(0x0F);
    let mut tot = [_mm256_setzero_ps(); R];
    for g in 0..groups {
        let mut q = [_mm256_setzero_ps(); R];
        let end = if ONE {
            g + 1
        } else {
            ((g + 1) * group_runs).min(runs)
        };
        for run in g * group_runs..end {
            // SAFETY: `run < runs`, so the 32 floats of `x` and each row's
            // 16 bytes at `16 * run` are in bounds (the function's
            // contract); `_mm_loadl_epi64` reads 8 bytes.
            unsafe {
                if run % 4 == 0 {
                    // Each row is its own stream and the pass walks four
                    // side by side: fetch a line `a.ahead` bytes ahead of
                    // each, into L2, as INT4's strips do.
                    for row in &rows {
                        let at = row.codes.wrapping_add(run * RUN / 2 + a.ahead);
                        // A prefetch never faults, whatever the address.
                        _mm_prefetch::<_MM_HINT_T1>(at.cast());
                    }
                }
                for h in 0..2 {
                    let xr = px.add(run * RUN + 8 * h);
                    let (xl, xh) = (_mm256_loadu_ps(xr), _mm256_loadu_ps(xr.add(16)));
                    for (qi, row) in q.iter_mut().zip(&rows) {
                        let p = row.codes.add(run * RUN / 2 + 8 * h);
                        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
                        let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
                        let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v));
                        *qi = _mm256_fmadd_ps(lo, xl, *qi);
                        *qi = _mm256_fmadd_ps(hi, xh, *qi);
                    }
                }
            }
        }
        for i in 0..R {
            // SAFETY: group `g`'s pair is inside the row's `dm` (the
            // function's contract); `vbroadcastss` reads one float.
            unsafe {
                let d = _mm256_broadcast_ss(&*rows[i].dm.add(2 * g));
                tot[i] = _mm256_fmadd_ps(q[i], d, tot[i]);
            }
        }
    }
    let mut out = [0f32; R];
    for i in 0..R {
        // SAFETY: the row's `dm` has `xsum.len()` floats; AVX2 is enabled.
        tot[i] = unsafe { pair_dot(tot[i], rows[i].dm, a.xsum) };
    }
    if R == 4 {
        // SAFETY: AVX2 is enabled.
        let s = unsafe { hsum4([tot[0], tot[1 % R], tot[2 % R], tot[3 % R]]) };
        out.copy_from_slice(&s[..R]);
    } else {
        for i in 0..R {
            // SAFETY: AVX2 is enabled.
            out[i] = unsafe { tot[i].hsum() };
        }
    }
    out
}

/// The horizontal sums of four vectors at once (three `vhaddps` and one
/// 128-bit add, where four separate sums take six operations each).
///
/// # Safety
/// AVX2 is enabled (the caller's features).
#[inline(always)]
unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: AVX2 (the caller's); 4 floats into `out`.
    unsafe {
        let ab = _mm256_hadd_ps(v[0], v[1]);
        let cd = _mm256_hadd_ps(v[2], v[3]);
        // Lanes: the four vectors' sums of elements 0-3, then of 4-7.
        let abcd = _mm256_hadd_ps(ab, cd);
        let s = _mm_add_ps(
            _mm256_castps256_ps128(abcd),
            _mm256_extractf128_ps::<1>(abcd),
        );
        _mm_storeu_ps(out.as_mut_ptr(), s);
    }
    out
}

/// `acc + dm[j] * xsum[j]` over the `xsum.len()` floats, lane by lane:
/// the minima's term (the `d` slots meet the zeros of `xsum`) added into
/// the row's total before its one horizontal sum.
///
/// # Safety
/// AVX2 and FMA are enabled (the caller's features); `dm` holds
/// `xsum.len()` floats, a multiple of 8.
#[inline(always)]
unsafe fn pair_dot(mut acc: __m256, dm: *const f32, xsum: &[f32]) -> __m256 {
    debug_assert!(xsum.len().is_multiple_of(8));
    // SAFETY: every index is below `xsum.len()`, which `dm` holds too.
    unsafe {
        for j in (0..xsum.len()).step_by(8) {
            let v = _mm256_loadu_ps(dm.add(j));
            acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(xsum.as_ptr().add(j)), acc);
        }
    }
    acc
}

/// `out[i] = h[i]` as f32 (exact) for IEEE half bits `h`: eight at a time
/// with F16C where `dots` has it, else the scalar conversion.
pub(crate) fn halves_to_f32(dots: Dots, h: &[u16], out: &mut [f32]) {
    assert_eq!(h.len(), out.len());
    if let Dots::Avx2(_, Some(f)) = dots {
        // SAFETY: the token proves F16C; the lengths are equal.
        unsafe { halves_f16c(f, h, out) };
    } else {
        out.iter_mut()
            .zip(h)
            .for_each(|(o, &v)| *o = super::half(v));
    }
}

/// # Safety
/// None beyond the token (AVX2, FMA and F16C); `h.len() == out.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves_f16c(_: crate::simd::Avx2F16c, h: &[u16], out: &mut [f32]) {
    let n8 = h.len() / 8 * 8;
    for (hc, oc) in h[..n8].chunks_exact(8).zip(out[..n8].chunks_exact_mut(8)) {
        // SAFETY: 8 halves (16 bytes) in, 8 floats out.
        unsafe {
            let v = _mm_loadu_si128(hc.as_ptr().cast());
            _mm256_storeu_ps(oc.as_mut_ptr(), _mm256_cvtph_ps(v));
        }
    }
    for (o, &v) in out[n8..].iter_mut().zip(&h[n8..]) {
        *o = super::half(v);
    }
}
