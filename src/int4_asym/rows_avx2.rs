//! The AVX2 row dot that the two nibble formats share (`int4_asym` and
//! `int4_k`): both store each run of 32 inputs of an output row as 16 bytes
//! (input `j` in byte `j`'s low nibble, input `j + 16` in its high nibble)
//! and both rows' dots are, per group `g` of runs,
//! `d_g * sum(q x) + c_g * sum(x)` (`c = m` for `int4_asym`, `-m` for
//! `int4_k`). Only the reading of `(d_g, c_g)` differs: each format brings
//! a [`GroupScales`] that writes them as f32 pairs, once per row and call.
//!
//! Why this shape (measured on Zen 3, docs/benchmarks.md): the per-row body
//! it replaces widened every code through 128-bit shuffles, summed `x` again
//! for every row and chained two FMAs per group into one accumulator, which
//! held it to 0.15-0.3 of INT4 g32's bytes per second. Here
//! - `sum(x)` per group is computed once per call, not per row;
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
//! Rounding: per group, `sum(q x)` in two f32 chains per lane (low and
//! high nibbles) and their sum, one FMA with `d_g`; `sum(x)` per group as
//! eight f32 lanes then a horizontal sum; so
//! the result is within `(in + 3) * eps_f32 * sum_i (|d q_i| + |c|)
//! |x_i|` of the exact value, the bound of the per-format scalar twins.

use std::arch::x86_64::*;

use super::RUN;
use crate::linear::dispatch::Dots;
use crate::simd::{Avx2, F32Lanes};

/// Output rows one pass of the kernel serves (registers: see `kernel`).
const ROWS: usize = 4;

/// Bytes ahead along each row that the kernel prefetches (INT4's distance,
/// `crate::int4`'s strips).
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
    let mut xsum = vec![0f32; stride];
    // SAFETY: the token proves AVX2 and FMA; `xsum` has one pair per group
    // of `x`.
    unsafe { group_sums(t, x, group_runs, &mut xsum[..pairs]) };
    let mut dm = vec![0f32; ROWS * stride];
    let row_bytes = in_feat / 2;
    for (b, o) in out.chunks_mut(ROWS).enumerate() {
        let first = r0 + b * ROWS;
        for (i, d) in dm.chunks_exact_mut(stride).take(o.len()).enumerate() {
            s.group_scales_padded(dots, first + i, pairs, d);
        }
        let at = |i: usize| Rows {
            codes: codes[(first + i) * row_bytes..].as_ptr(),
            dm: dm[i * stride..].as_ptr(),
        };
        let args = Args {
            x,
            xsum: &xsum,
            group_runs,
            groups,
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
/// Chains: two code accumulators per row (the low nibbles' FMAs of a run in
/// one, the high nibbles' in the other), so a run's four FMAs per row form
/// two chains of two, not one of four: with one accumulator a group of
/// four runs (g128) was a chain of 16 dependent FMAs per row, four rows'
/// chains one FMA per cycle at Zen 3's 4-cycle latency where two pipes
/// could take two (measured: 0-3 % at batch 1, docs/benchmarks.md). One
/// total per row is the only chain that crosses groups (one FMA each). At
/// `R = 4` that is 12 accumulators beside `x` (4), the mask and the
/// decoded codes: more than 16 registers, so some live on the stack (L1)
/// across the groups.
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
        let mut q = [[_mm256_setzero_ps(); 2]; R];
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
                    // side by side: fetch a line `PREFETCH_AHEAD` bytes
                    // ahead of each, into L2, as INT4's strips do.
                    for row in &rows {
                        let at = row.codes.wrapping_add(run * RUN / 2 + PREFETCH_AHEAD);
                        // A prefetch never faults, whatever the address.
                        _mm_prefetch::<_MM_HINT_T1>(at.cast());
                    }
                }
                let xr = px.add(run * RUN);
                let x0 = _mm256_loadu_ps(xr);
                let x1 = _mm256_loadu_ps(xr.add(8));
                let x2 = _mm256_loadu_ps(xr.add(16));
                let x3 = _mm256_loadu_ps(xr.add(24));
                for (qi, row) in q.iter_mut().zip(&rows) {
                    let p = row.codes.add(run * RUN / 2);
                    // Bytes 0-7: inputs 0-7 (low nibbles) and 16-23 (high);
                    // bytes 8-15: inputs 8-15 and 24-31.
                    let v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
                    let v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast()));
                    let lo0 = _mm256_cvtepi32_ps(_mm256_and_si256(v0, mask));
                    let lo1 = _mm256_cvtepi32_ps(_mm256_and_si256(v1, mask));
                    let hi0 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v0));
                    let hi1 = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v1));
                    qi[0] = _mm256_fmadd_ps(lo0, x0, qi[0]);
                    qi[1] = _mm256_fmadd_ps(lo1, x1, qi[1]);
                    qi[0] = _mm256_fmadd_ps(hi0, x2, qi[0]);
                    qi[1] = _mm256_fmadd_ps(hi1, x3, qi[1]);
                }
            }
        }
        for ((ti, qi), row) in tot.iter_mut().zip(&q).zip(&rows) {
            // SAFETY: group `g`'s pair is inside the row's `dm` (the
            // function's contract); `vbroadcastss` reads one float.
            unsafe {
                let d = _mm256_broadcast_ss(&*row.dm.add(2 * g));
                *ti = _mm256_fmadd_ps(_mm256_add_ps(qi[0], qi[1]), d, *ti);
            }
        }
    }
    std::array::from_fn(|i| {
        // SAFETY: the row's `dm` has `xsum.len()` floats; AVX2 is enabled.
        unsafe { tot[i].hsum() + pair_dot(rows[i].dm, a.xsum) }
    })
}

/// `sum_j dm[j] * xsum[j]` over `xsum.len()` floats: the minima's term
/// (the `d` slots meet the zeros of `xsum`).
///
/// # Safety
/// AVX2 and FMA are enabled (the caller's features); `dm` holds
/// `xsum.len()` floats.
#[inline(always)]
unsafe fn pair_dot(dm: *const f32, xsum: &[f32]) -> f32 {
    let n8 = xsum.len() / 8 * 8;
    // SAFETY: every index is below `xsum.len()`, which `dm` holds too.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for j in (0..n8).step_by(8) {
            let v = _mm256_loadu_ps(dm.add(j));
            acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(xsum.as_ptr().add(j)), acc);
        }
        let mut s = acc.hsum();
        for (j, &xs) in xsum.iter().enumerate().skip(n8) {
            s += *dm.add(j) * xs;
        }
        s
    }
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
