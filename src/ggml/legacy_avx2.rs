//! The AVX2 + F16C float32-activation row dot of the 32-weight block types
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: `GgmlType::LEGACY`), several output rows
//! per pass over `x` (the batch-1 forward of `GgufWeight`).
//!
//! Why this shape (measured on Zen 3, docs/benchmarks.md "GGUF block
//! weights"): the generic multi-row kernel (`rows_avx2.rs`, which the
//! k-quants keep) converted every block's halves with scalar code into a
//! buffer before each pass (about 40 % of Q4_0's time) and widened the codes
//! from one register (four sign extensions, three extracts). Here, per block
//! and row:
//! - the codes are widened straight from memory as the INT4 matvec does:
//!   `vpmovzxbd` of 8 bytes gives weights `8c..8c + 8` in the low nibbles
//!   and `16 + 8c..` in the high ones (ggml's nibble order needs no
//!   permutation), an `and` and a shift split them, two conversions and two
//!   FMAs against `x[8c..]` and `x[16 + 8c..]`; Q8_0 sign-extends its bytes;
//! - the fifth bits of Q5_0 / Q5_1 come from a table of 256 rows of eight
//!   i32 lanes (`0` or `16`), indexed by a byte of `qh` and or-ed into the
//!   nibbles (one vector op per 8 weights; the table is 8 KiB, in L1);
//! - the code offset (`q = n - 8` for Q4_0, `n - 16` for Q5_0) is not
//!   subtracted per weight: each row's chain starts from the 8 lanes of
//!   `-bias * sum(x)` of the block, for Q4_0 formed once per call
//!   (`fill_pre`) and read from memory by every pass (on Zen 3, one thread,
//!   6-14 % less time per call in cache than forming them in each pass:
//!   three adds and a multiply per block and pass), for Q5_0 formed in
//!   each pass (`starts_in_pre`);
//! - the halves are converted with F16C, exact for every finite half
//!   (`bad_scale` refuses the others at load): per block a broadcast half
//!   and an 8-lane conversion, but Q5_1 rows of at least `GROUP` blocks
//!   convert the `(d, m)` pairs of 8 consecutive blocks at once (`pairs8`:
//!   4-byte loads, interleaves, two `vcvtph2ps` of 8 halves; the last group
//!   of a row overlaps the one before it) into a stack buffer from which
//!   each block's `d` is a broadcast load (see `kernel` for the types
//!   that gained nothing from the same for their halves);
//! - the minimum's term of Q4_1 / Q5_1 is `m * sum(x)` per block: the 32-sum
//!   of each block of `x` is formed once per call (`fill_pre`, as the pair
//!   `(0, sum)`). Q5_1's groups FMA their converted `(d, m)` pairs, four
//!   blocks per vector, against those pairs (odd lanes gather `m * sum`);
//!   Q4_1 per block and row one 4-lane FMA of the converted `(d, m)` pair
//!   (on Zen 3, one thread, paired with the body that converted `m` as a
//!   second broadcast half into an 8-lane FMA: Q4_1 7-20 % and Q5_1 5-11 %
//!   less time per call);
//! - a full pass prefetches the next pass's rows, as far ahead in them as
//!   it is in its own (Q8_0 4-12 % less time, the others within the noise).
//!
//! Tried on the same machine and no faster (within the noise of the paired
//! runs): converting a pass's halves 8 at a time with scalar code into a
//! buffer first, the
//! pass's `(d, m)` pairs gathered into one vector and converted at once, 6
//! or 8 rows per pass, two product chains per row and block, two or four
//! blocks per loop step (the scale FMAs after both blocks' chains), and
//! Q4_0's offset moved from the chains into the minimum's lane.
//!
//! Rounding: per block and row one f32 chain per lane over the terms
//! `n_i x_i` and `-bias x_i` (the latter through `sum(x)`: two adds per
//! lane, times a power of two), one FMA with `d` into the row's total; for
//! the types with a minimum, each block's `sum(x)` in 31 adds (5 per input),
//! one FMA with `m` into one of the row's minimum lanes; one horizontal sum
//! of each (8 lanes) and one add of the two. The grouped halves change no
//! value: Q4_0, Q5_0 and Q8_0 give the per-pass body's results bit for
//! bit (the start lanes are the same sums, only formed once per call).
//! Every product so passes fewer than `in + 2` roundings: that is the fused
//! dot's bound (`fused.rs`) for the map `w = d n + (m - bias d)` of the
//! unsigned code `n`: within `(in + 2) * eps_f32 * sum_i (|d n_i| + |m -
//! bias d|) |x_i|` of the float64 dot of the dequantized row.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{GgmlType, Legacy};
use crate::simd::{Avx2F16c, F32Lanes};

/// Output rows one pass serves: per row a total and (types with a minimum)
/// a minimum total beside the four `x` registers, `sum(x)`, the chain and
/// the codes.
const ROWS: usize = 4;

/// `out[i] = row (r0 + i) . x` for the rows of `data`, `row_bytes` bytes
/// (whole blocks of `T`) each, `x` their `row_bytes / BYTES * 32` inputs.
/// `T::LEGACY` must describe its blocks (not `Legacy::No`).
pub(crate) fn dot_rows<T: GgmlType>(
    t: Avx2F16c,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    out: &mut [f32],
) {
    assert!(T::ELEMS == 32 && T::LEGACY != Legacy::No);
    assert!(
        row_bytes.is_multiple_of(T::BYTES)
            && x.len() == row_bytes / T::BYTES * T::ELEMS
            && data.len() >= (r0 + out.len()) * row_bytes
    );
    if pre_per_block::<T>() == 0 {
        return passes::<T>(t, data, row_bytes, r0, x, &[], out);
    }
    PRE.with(|pre| {
        let mut pre = pre.borrow_mut();
        // SAFETY: the token proves AVX2 and FMA; `x` is whole blocks.
        unsafe { fill_pre::<T>(t, x, &mut pre) };
        passes::<T>(t, data, row_bytes, r0, x, &pre, out);
    });
}

thread_local! {
    /// Each thread's per-call terms of `x` (`fill_pre`), refilled in place
    /// on every call: no allocation per call once grown (the row engine
    /// calls once per task of 4 to 64 rows).
    static PRE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Floats of `fill_pre`'s output per block of `x`.
const fn pre_per_block<T: GgmlType>() -> usize {
    if T::AFFINE {
        2
    } else if starts_in_pre::<T>() {
        8
    } else {
        0
    }
}

/// Whether the chains' start lanes come from `fill_pre` (Q4_0) rather than
/// from each pass (Q5_0: with them from `fill_pre` a `[4096, 11008]` call,
/// from DRAM, took 5-20 % more time on Zen 3, one thread, in four paired
/// runs, for 3-8 % less in cache).
const fn starts_in_pre<T: GgmlType>() -> bool {
    matches!(T::LEGACY, Legacy::Nibbles { bias, .. } if bias != 0)
}

/// The terms of `x` every row of a call shares, per block `k` of `x`:
/// - Q4_0 (`starts_in_pre`): the 8 lanes of the chains'
///   start `-bias * ((x0 + x1) + (x2 + x3))`, `xj` the block's four
///   8-float vectors (exact times the power of two `bias`), at `8k`;
/// - a type with a minimum: `(0, sum(x[32k..32k + 32]))` at `2k` (four
///   vectors added in a tree, then the horizontal sum: 5 adds per input),
///   the pair laid out as the converted `(d, m)` halves are, so that one
///   FMA per row and four blocks gathers `m * sum` (and `d * 0`).
///
/// # Safety
/// None beyond the token; `x.len()` a multiple of 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_pre<T: GgmlType>(_: Avx2F16c, x: &[f32], pre: &mut Vec<f32>) {
    let per = pre_per_block::<T>();
    pre.resize(x.len() / 32 * per, 0.0);
    let neg_bias = _mm256_set1_ps(-f32::from(T::LEGACY.bias()));
    for (s, xb) in pre.chunks_exact_mut(per).zip(x.chunks_exact(32)) {
        // SAFETY: `xb` holds 32 floats, `s` `per` (8 for the offset types).
        unsafe {
            let p = xb.as_ptr();
            let a = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            let b = _mm256_add_ps(_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
            let sum = _mm256_add_ps(a, b);
            if T::AFFINE {
                s[0] = 0.0;
                s[1] = sum.hsum();
            } else {
                _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(sum, neg_bias));
            }
        }
    }
}

/// The passes of up to `ROWS` rows over `x` (`pre`: `fill_pre`'s terms of
/// `x`; empty where `pre_per_block` is 0: Q5_0, Q8_0).
fn passes<T: GgmlType>(
    t: Avx2F16c,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    pre: &[f32],
    out: &mut [f32],
) {
    assert!(pre.len() == x.len() / 32 * pre_per_block::<T>());
    for (p, o) in out.chunks_mut(ROWS).enumerate() {
        let first = (r0 + p * ROWS) * row_bytes;
        let at = |i: usize| data[first + i * row_bytes..].as_ptr();
        // The next pass's rows, contiguous after this pass's (only
        // prefetched: the address need not be inside `data`).
        let next = data.as_ptr().wrapping_add(first + ROWS * row_bytes);
        let rows = Rows { x, pre, next };
        // SAFETY: (every arm) the token proves AVX2, FMA and F16C; each
        // row starts `row_bytes` readable bytes (asserted by `dot_rows`),
        // the whole blocks that `x` spans; `pre` as asserted above.
        unsafe {
            match o.len() {
                4 => o.copy_from_slice(&kernel::<T, 4>(t, &rows, [at(0), at(1), at(2), at(3)])),
                3 => o.copy_from_slice(&kernel::<T, 3>(t, &rows, [at(0), at(1), at(2)])),
                2 => o.copy_from_slice(&kernel::<T, 2>(t, &rows, [at(0), at(1)])),
                _ => o.copy_from_slice(&kernel::<T, 1>(t, &rows, [at(0)])),
            }
        }
    }
}

/// What a pass reads besides its rows.
struct Rows<'a> {
    x: &'a [f32],
    /// `fill_pre`'s terms of `x` (Q4_0 and the types with a minimum), else
    /// empty.
    pre: &'a [f32],
    /// The first byte of the next pass's rows (a prefetch address).
    next: *const u8,
}

/// Row `b` of the table: lane `l` is 16 where bit `l` of `b` is set.
#[repr(C, align(32))]
struct FifthBits([[i32; 8]; 256]);

static FIFTH: FifthBits = {
    let mut t = [[0i32; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut l = 0;
        while l < 8 {
            t[b][l] = (((b >> l) & 1) as i32) << 4;
            l += 1;
        }
        b += 1;
    }
    FifthBits(t)
};

/// The half at `p` as eight equal f32 lanes (exact).
///
/// # Safety
/// F16C in force; 2 readable bytes at `p`.
#[inline(always)]
unsafe fn half8(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(p.cast::<i16>().read_unaligned())) }
}

/// Bytes `o..o + 8` of the block at `b` zero-extended to i32 lanes, split
/// into their low nibbles and their high nibbles.
///
/// # Safety
/// AVX2 in force; 8 readable bytes at `b + o`.
#[inline(always)]
unsafe fn nibbles8(b: *const u8, o: usize) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract.
    unsafe {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.add(o).cast()));
        (
            _mm256_and_si256(v, _mm256_set1_epi32(15)),
            _mm256_srli_epi32::<4>(v),
        )
    }
}

/// Row `FIFTH[byte]` as i32 lanes.
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
unsafe fn fifth8(byte: u8) -> __m256i {
    // SAFETY: every row is 32 bytes, 32-byte aligned.
    unsafe { _mm256_load_si256(FIFTH.0[usize::from(byte)].as_ptr().cast()) }
}

/// Bytes `o..o + 8` of the block at `b`, sign-extended to i32 lanes.
///
/// # Safety
/// AVX2 in force; 8 readable bytes at `b + o`.
#[inline(always)]
unsafe fn bytes8(b: *const u8, o: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(o).cast())) }
}

/// The unsigned codes `n` of weights `8c..8c + 8` and `16 + 8c..24 + 8c`
/// of the block at `b`, as i32 lanes. (Helper functions, not closures: a
/// closure is not inlined into a `#[target_feature]` function.)
///
/// # Safety
/// AVX2 in force; `BYTES` readable bytes at `b`; `c < 2`.
#[inline(always)]
unsafe fn codes8<T: GgmlType>(b: *const u8, c: usize) -> (__m256i, __m256i) {
    // SAFETY: every offset named by `T::LEGACY` is inside the block.
    unsafe {
        match T::LEGACY {
            Legacy::Nibbles { qs, .. } => nibbles8(b, qs + 8 * c),
            Legacy::Fifth { qh, qs, .. } => {
                let (lo, hi) = nibbles8(b, qs + 8 * c);
                (
                    _mm256_or_si256(lo, fifth8(*b.add(qh + c))),
                    _mm256_or_si256(hi, fifth8(*b.add(qh + 2 + c))),
                )
            }
            Legacy::Bytes { qs } => (bytes8(b, qs + 8 * c), bytes8(b, qs + 16 + 8 * c)),
            Legacy::No => unreachable!("legacy_avx2 on a type without a LEGACY layout"),
        }
    }
}

/// Blocks whose halves a row converts together (`pairs8`).
const GROUP: usize = 8;

/// `KEEP.0[16..]` all ones, `KEEP.0[..16]` zero: a window of 16 of it
/// keeps the lanes from a given one on.
#[repr(C)]
struct Keep([u32; 32]);

static KEEP: Keep = {
    let mut t = [0u32; 32];
    let mut i = 16;
    while i < 32 {
        t[i] = u32::MAX;
        i += 1;
    }
    Keep(t)
};

/// 4 bytes at `b + o` in lane 0 of a vector (its other lanes zero).
///
/// # Safety
/// SSE2 in force; 4 readable bytes at `b + o`.
#[inline(always)]
unsafe fn word4(b: *const u8, o: usize) -> __m128i {
    // SAFETY: the caller's contract.
    unsafe { _mm_cvtsi32_si128(b.add(o).cast::<i32>().read_unaligned()) }
}

/// The `(d, m)` half pairs at byte 0 of `GROUP` consecutive blocks from
/// `b`, as f32 lanes `(d0, m0, .., d3, m3)` and `(d4, m4, .., d7, m7)`
/// (exact).
///
/// # Safety
/// AVX2 and F16C in force; `GROUP` blocks of `T` readable at `b`.
#[inline(always)]
unsafe fn pairs8<T: GgmlType>(b: *const u8) -> (__m256, __m256) {
    let n = T::BYTES;
    // SAFETY: every block holds its two halves at bytes 0..4.
    unsafe {
        let q01 = _mm_unpacklo_epi32(word4(b, 0), word4(b, n));
        let q23 = _mm_unpacklo_epi32(word4(b, 2 * n), word4(b, 3 * n));
        let q45 = _mm_unpacklo_epi32(word4(b, 4 * n), word4(b, 5 * n));
        let q67 = _mm_unpacklo_epi32(word4(b, 6 * n), word4(b, 7 * n));
        (
            _mm256_cvtph_ps(_mm_unpacklo_epi64(q01, q23)),
            _mm256_cvtph_ps(_mm_unpacklo_epi64(q45, q67)),
        )
    }
}

/// Block `k`'s unscaled chains of the `R` rows: per row
/// `start + sum_i n_i x_i` in 8 lanes, `start` the block's `-bias * sum(x)`
/// lanes from `rows.pre` (zero without an offset). A full pass also
/// prefetches the next pass's rows.
///
/// # Safety
/// As [`kernel`]; `k < x.len() / 32`.
#[inline(always)]
unsafe fn chains<T: GgmlType, const R: usize>(
    rows: &Rows,
    at: &[*const u8; R],
    k: usize,
) -> [__m256; R] {
    if R == ROWS {
        let ahead = rows.next.wrapping_add(k * R * T::BYTES);
        for l in 0..(R * T::BYTES).div_ceil(64) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l).cast()) };
        }
    }
    // SAFETY: the block's 32 inputs are inside `x`, its bytes inside each
    // row and its start lanes inside `pre` (the caller's contract).
    unsafe {
        let xb = rows.x.as_ptr().add(32 * k);
        let xv = [
            _mm256_loadu_ps(xb),
            _mm256_loadu_ps(xb.add(8)),
            _mm256_loadu_ps(xb.add(16)),
            _mm256_loadu_ps(xb.add(24)),
        ];
        let bias = T::LEGACY.bias();
        let start = if starts_in_pre::<T>() {
            _mm256_loadu_ps(rows.pre.as_ptr().add(8 * k))
        } else if bias != 0 {
            // The same sums as `fill_pre`'s (exact times the power of two).
            let s = _mm256_add_ps(_mm256_add_ps(xv[0], xv[1]), _mm256_add_ps(xv[2], xv[3]));
            _mm256_mul_ps(s, _mm256_set1_ps(-f32::from(bias)))
        } else {
            _mm256_setzero_ps()
        };
        let mut p = [start; R];
        for (pi, &a) in p.iter_mut().zip(at) {
            let b = a.add(k * T::BYTES);
            let (lo0, hi0) = codes8::<T>(b, 0);
            let (lo1, hi1) = codes8::<T>(b, 1);
            *pi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo0), xv[0], *pi);
            *pi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi0), xv[2], *pi);
            *pi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo1), xv[1], *pi);
            *pi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi1), xv[3], *pi);
        }
        p
    }
}

/// Blocks `g0 + skip..g0 + GROUP` of the `R` rows of a type with a
/// minimum into their totals `tot` and `mins`: each row's halves of the
/// group's blocks converted together first.
///
/// # Safety
/// As [`kernel`]; `T::AFFINE`; blocks `g0..g0 + GROUP` inside `x` and
/// every row; `skip < GROUP`.
#[inline(always)]
unsafe fn group<T: GgmlType, const R: usize>(
    rows: &Rows,
    at: &[*const u8; R],
    g0: usize,
    skip: usize,
    tot: &mut [__m256; R],
    mins: &mut [__m256; R],
) {
    // Each row's converted `(d, m)` pairs of the group's blocks: `d` of
    // block `g0 + j` at lane `2j`.
    let mut sc = [[0f32; 2 * GROUP]; R];
    for i in 0..R {
        // SAFETY: the group's blocks are inside the row and their `(0,
        // sum)` pairs inside `pre` (the caller's contract); the mask's
        // window `16 - 2 skip..32 - 2 skip` is inside `KEEP`.
        unsafe {
            let b = at[i].add(g0 * T::BYTES);
            let (lo, hi) = pairs8::<T>(b);
            _mm256_storeu_ps(sc[i].as_mut_ptr(), lo);
            _mm256_storeu_ps(sc[i].as_mut_ptr().add(8), hi);
            // The skipped blocks' sums masked to zero.
            let s = rows.pre.as_ptr().add(2 * g0);
            let keep = KEEP.0.as_ptr().add(16 - 2 * skip).cast::<f32>();
            let s_lo = _mm256_and_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(keep));
            let s_hi = _mm256_and_ps(_mm256_loadu_ps(s.add(8)), _mm256_loadu_ps(keep.add(8)));
            mins[i] = _mm256_fmadd_ps(lo, s_lo, mins[i]);
            mins[i] = _mm256_fmadd_ps(hi, s_hi, mins[i]);
        }
    }
    for j in skip..GROUP {
        // SAFETY: block `g0 + j` is inside `x` and every row.
        let p = unsafe { chains::<T, R>(rows, at, g0 + j) };
        for i in 0..R {
            // SAFETY: AVX is in force (the caller's contract).
            unsafe {
                let d = _mm256_broadcast_ss(&sc[i][2 * j]);
                tot[i] = _mm256_fmadd_ps(p[i], d, tot[i]);
            }
        }
    }
}

/// The dots of `R` rows (see the module docs).
///
/// # Safety
/// None beyond the token (AVX2, FMA, F16C); each row has `x.len() / 32 *
/// BYTES` readable bytes, `x.len()` a multiple of 32; `rows.pre` holds
/// `fill_pre`'s terms of `x` for `T`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<T: GgmlType, const R: usize>(
    _: Avx2F16c,
    rows: &Rows,
    at: [*const u8; R],
) -> [f32; R] {
    let blocks = rows.x.len() / 32;
    let mut tot = [_mm256_setzero_ps(); R];
    // Types with a minimum: the odd lanes gather `m * sum(x)` (the even
    // ones `d * 0`).
    let mut mins = [_mm256_setzero_ps(); R];
    // Only Q5_1 converts its halves by groups: on Zen 3 (one thread,
    // paired with the per-block body) it took 12-20 % less time per call
    // with them, where Q4_0 and Q5_0 gained nothing over the per-block body
    // (Q5_0 took 12-20 % more from DRAM), Q4_1 took 6-13 % more and Q8_0
    // 3-8 % more.
    let grouped = blocks >= GROUP
        && match T::LEGACY {
            Legacy::Fifth { .. } => T::AFFINE,
            Legacy::Nibbles { .. } | Legacy::Bytes { .. } | Legacy::No => false,
        };
    let mut k = 0;
    while grouped && k < blocks {
        // The group's first block: the last group ends at the row's end
        // and overlaps the one before it, whose `skip` blocks it leaves.
        let g0 = k.min(blocks - GROUP);
        // SAFETY: the group's blocks are inside `x` and every row (the
        // function's contract); `skip < GROUP`.
        unsafe {
            match k - g0 {
                // A whole group unrolls (constant bounds).
                0 => group::<T, R>(rows, &at, g0, 0, &mut tot, &mut mins),
                skip => group::<T, R>(rows, &at, g0, skip, &mut tot, &mut mins),
            }
        }
        k = g0 + GROUP;
    }
    // Rows of fewer than `GROUP` blocks (and Q8_0): halves converted per
    // block.
    for k in k..blocks {
        // SAFETY: block `k` is inside `x`, every row and `pre`.
        unsafe {
            let p = chains::<T, R>(rows, &at, k);
            for i in 0..R {
                let b = at[i].add(k * T::BYTES);
                if T::AFFINE {
                    // `(d, m, 0, 0)` from the halves at bytes 0 and 2
                    // against `(0, sum, 0, 0)`.
                    let dm = _mm_cvtph_ps(word4(b, 0));
                    tot[i] = _mm256_fmadd_ps(p[i], _mm256_broadcastss_ps(dm), tot[i]);
                    let s = _mm_castpd_ps(_mm_load_sd(rows.pre.as_ptr().add(2 * k).cast()));
                    let (dm, s) = (_mm256_zextps128_ps256(dm), _mm256_zextps128_ps256(s));
                    mins[i] = _mm256_fmadd_ps(dm, s, mins[i]);
                } else {
                    tot[i] = _mm256_fmadd_ps(p[i], half8(b), tot[i]);
                }
            }
        }
    }
    let mut out = [0f32; R];
    for ((o, t), m) in out.iter_mut().zip(tot).zip(mins) {
        // SAFETY: AVX2 is enabled.
        *o = unsafe {
            if T::AFFINE {
                t.hsum() + m.hsum()
            } else {
                t.hsum()
            }
        };
    }
    out
}
