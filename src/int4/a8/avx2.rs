//! AVX2 kernel of the int8-activation INT4 matvec. Callable only with an
//! [`Avx2`] token, which proves the CPU has the features.
//!
//! A strip is 32 output columns: one 32-byte load per pair of input rows
//! (`data[p * out_feat + c ..]`, low nibble row `2p`, high nibble row
//! `2p + 1`). XOR with `0x88` turns both two's-complement nibbles into
//! `q + 8` in 0..15; the nibbles are split (and, shift + and) and
//! interleaved back (`unpacklo/hi_epi8`) so that each 16-bit lane holds
//! rows `2p` and `2p + 1` of one column: `vpmaddubsw` against the byte pair
//! `(x_q[2p], x_q[2p + 1])` broadcast to every lane then gives that
//! column's two products already added. Eight pairs are summed in i16
//! (at most `8 * 2 * 15 * 127 = 30480`, below `i16::MAX`), then widened
//! and added in i32; per group `8 * sum(x_q)` is taken back off (the
//! offset), and the f32 epilogue is the scalar twin's, operation for
//! operation, so both give the same bits.

use std::arch::x86_64::*;
use std::ops::Range;

use super::scalar::{cols_scalar, A8Args};
use crate::simd::Avx2;

/// Output columns per strip (one 256-bit load of packed bytes).
const STRIP: usize = 32;
/// Pairs of rows summed in i16 before widening (see the module docs).
const BATCH_PAIRS: usize = 8;
/// Rows of `x` a strip serves at once: their 16-bit sums are 2 registers
/// each, next to the decoded weights.
const ROWS_PER_PASS: usize = 4;
/// Most rows one [`strip_block`] serves (its 32-bit sums, 128 bytes per
/// row, live on the stack).
const ROW_BLOCK: usize = 16;
/// Largest group size the kernel takes: its i32 sums (at most
/// `15 * 127 * group_size`) stay exact far below `i32::MAX`.
const MAX_GROUP: usize = 1 << 16;

/// Whether the kernel takes weights of `group_size` (whole batches of
/// `BATCH_PAIRS` pairs); other group sizes run the scalar twin.
pub(crate) fn eligible(group_size: usize) -> bool {
    group_size.is_multiple_of(2 * BATCH_PAIRS) && group_size <= MAX_GROUP
}

/// `ys[j][..] = (W^T x_r)[o0 .. o0 + width]` for the rows `r` of `rows`
/// (`ys[j]` is row `rows.start + j`). Whole strips run here, the columns
/// short of a strip through the scalar twin.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA. Every size is checked.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn cols(
    _: Avx2,
    args: &A8Args,
    rows: Range<usize>,
    o0: usize,
    ys: &mut [&mut [f32]],
) {
    let width = args.check_cols(&rows, o0, ys);
    assert!(eligible(args.group_size));
    let main = width / STRIP * STRIP;
    for y in ys.iter_mut() {
        y[..main].fill(0.0);
    }
    let count = rows.len();
    let half = args.group_size / 2;
    // The per-row strips (up to four rows) walk a group in slabs of at most
    // SLAB_PAIRS pairs, carrying their i32 sums between slabs (exact): a
    // group of 128 walked whole is 64 concurrent streams, which Zen 3 reads
    // from DRAM at a third of the rate of 16. The blocked rows are compute-
    // bound and keep whole groups.
    let slab_pairs = if count <= ROWS_PER_PASS {
        SLAB_PAIRS.min(half)
    } else {
        half
    };
    let mut carry = vec![0i32; if slab_pairs < half { count * main } else { 0 }];
    // SAFETY: the features are this function's; the sizes are checked.
    unsafe {
        if carry.is_empty() {
            walk::<false>(args, rows.clone(), o0, ys, width, slab_pairs, &mut carry)
        } else {
            walk::<true>(args, rows.clone(), o0, ys, width, slab_pairs, &mut carry)
        }
    }
    if main < width {
        let mut tails: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[main..]).collect();
        cols_scalar(args, rows, o0 + main, &mut tails);
    }
}

/// The whole strips of [`cols`] (`width` columns from `o0`, `ys` zeroed),
/// each group in slabs of `slab_pairs` pairs; `CARRY`: the slabs cut the
/// groups, their sums carried in `carry` (one instance per case, so that
/// whole groups run without the carry's branches).
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves; every
/// index is checked.
#[target_feature(enable = "avx2,fma")]
unsafe fn walk<const CARRY: bool>(
    args: &A8Args,
    rows: Range<usize>,
    o0: usize,
    ys: &mut [&mut [f32]],
    width: usize,
    slab_pairs: usize,
    carry: &mut [i32],
) {
    let (count, half) = (rows.len(), args.group_size / 2);
    let main = width / STRIP * STRIP;
    let full = width == args.out_feat;
    for g in args.groups.clone() {
        for p0 in (g * half..(g + 1) * half).step_by(slab_pairs) {
            let pairs = p0..(p0 + slab_pairs).min((g + 1) * half);
            let mut c = 0;
            while c < main {
                // Two strips at once where they fit: a strip uses half of
                // each cache line it loads, and with a row pitch that is a
                // multiple of 4 KiB the slab's rows all fall in one L1 set,
                // so the line would be gone before the next strip came back
                // for its other half.
                let h = if c + 2 * STRIP <= main { 2 } else { 1 };
                for k in 0..h {
                    prefetch_ahead(args, g, &pairs, o0, c + k * STRIP, main, full);
                }
                if count <= ROWS_PER_PASS {
                    let slab = Slab {
                        g,
                        pairs: pairs.clone(),
                        carry: &mut *carry,
                        pitch: main,
                    };
                    // SAFETY: (every arm) the features are this function's;
                    // `ys` holds exactly the arm's row count, and the
                    // strips' columns lie inside the matrix, every row and
                    // the carry (checked above and in `strip`).
                    unsafe {
                        let (o, r0) = (o0 + c, rows.start);
                        match (count, h) {
                            (4, 2) => strip::<4, 2, CARRY>(args, slab, o, c, r0, ys),
                            (4, _) => strip::<4, 1, CARRY>(args, slab, o, c, r0, ys),
                            (3, 2) => strip::<3, 2, CARRY>(args, slab, o, c, r0, ys),
                            (3, _) => strip::<3, 1, CARRY>(args, slab, o, c, r0, ys),
                            (2, 2) => strip::<2, 2, CARRY>(args, slab, o, c, r0, ys),
                            (2, _) => strip::<2, 1, CARRY>(args, slab, o, c, r0, ys),
                            (_, 2) => strip::<1, 2, CARRY>(args, slab, o, c, r0, ys),
                            _ => strip::<1, 1, CARRY>(args, slab, o, c, r0, ys),
                        }
                    }
                } else {
                    for k in 0..h {
                        let cs = c + k * STRIP;
                        for (b, part) in ys.chunks_mut(ROW_BLOCK).enumerate() {
                            let r0 = rows.start + b * ROW_BLOCK;
                            // SAFETY: as above; `part` holds at most
                            // ROW_BLOCK rows.
                            unsafe { strip_block(args, g, o0 + cs, cs, r0, part) }
                        }
                    }
                }
                c += h * STRIP;
            }
        }
    }
}

/// Bytes ahead along each row that a strip prefetches where the rows are
/// not a multiple of 4 KiB apart ([`prefetch_ahead`]).
const ROW_AHEAD: usize = 512;

/// Prefetch, while strip `c` (column `o0 + c`, of the task's `main`
/// columns in whole strips) of the slab `pairs` of group `g` runs, the
/// bytes that a later strip will read, in one of two ways measured on Zen 3
/// (docs/benchmarks.md, "What bounds the batch-1 INT4 matvec"):
///
/// - rows whose pitch is not a multiple of 4 KiB: each row of the slab
///   `ROW_AHEAD` bytes ahead, into the next slab's rows past the task's
///   last strip (one line per row every 64 columns). From DRAM this read
///   4096x11008 1.1-1.3x faster than the next one;
/// - rows a multiple of 4 KiB apart (where the first way ran 0.8x): a
///   strip's share of the next slab (the next group's first where this one
///   ends it), a slab of strips ahead. When the call spans every column
///   (`full`) a slab's packed rows are one contiguous block, fetched in
///   order (a single sequential stream); otherwise the same columns of the
///   next slab's rows, every other strip.
#[inline(always)]
fn prefetch_ahead(
    args: &A8Args,
    g: usize,
    pairs: &Range<usize>,
    o0: usize,
    c: usize,
    main: usize,
    full: bool,
) {
    let (n, len) = (args.out_feat, pairs.len());
    let data = args.data.as_ptr();
    let next = data.wrapping_add(pairs.end * n);
    if !n.is_multiple_of(4096) {
        if c.is_multiple_of(2 * STRIP) {
            let row = if c + ROW_AHEAD < main {
                data.wrapping_add(pairs.start * n + o0 + c + ROW_AHEAD)
            } else {
                next.wrapping_add(o0 + c + ROW_AHEAD - main)
            };
            for p in 0..len {
                prefetch(row.wrapping_add(p * n));
            }
        }
    } else if full {
        // Strip c of n / 32 covers bytes c * len .. (c + 32) * len of the
        // block of len * n bytes.
        let at = next.wrapping_add(c * len);
        for line in 0..(STRIP * len).div_ceil(64) {
            prefetch(at.wrapping_add(64 * line));
        }
    } else if c.is_multiple_of(2 * STRIP) {
        let row = next.wrapping_add(o0 + c);
        for p in 0..len {
            prefetch(row.wrapping_add(p * n));
        }
    }
    if c.is_multiple_of(2 * STRIP) {
        let s = args.scales.as_ptr().wrapping_add((g + 1) * n + o0 + c);
        prefetch(s as *const u8);
        prefetch(s.wrapping_add(16) as *const u8);
    }
}

/// Prefetch one cache line into L2 (`T1`: faster from DRAM than into L1,
/// see docs/benchmarks.md).
#[inline(always)]
fn prefetch(at: *const u8) {
    // SAFETY: a prefetch never faults, whatever the address; SSE is part of
    // x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(at as *const i8) };
}

/// Most pairs of rows a per-row strip walks side by side (a multiple of
/// `BATCH_PAIRS`): see `cols`.
const SLAB_PAIRS: usize = 16;

/// The pairs `pairs` of group `g` for a per-row [`strip`], and the i32 sums
/// carried between the slabs of a cut group: row `j`'s sum of task column
/// `c` at `carry[j * pitch + c]` (empty when the group is whole).
struct Slab<'a> {
    g: usize,
    pairs: Range<usize>,
    carry: &'a mut [i32],
    pitch: usize,
}

/// The slab `slab.pairs` of group `slab.g` against the `32 H` columns from
/// `col` (column `yoff` of each `ys[j]`) for the `R` rows of `x` from `r0`:
/// per batch of eight pairs, each 32-column half in turn, so that the
/// batch's eight cache lines are read whole while they are in L1. The sums
/// start from the nibbles' offset on the group's first pair (else from the
/// carry) and go through the epilogue after its last (else to the carry).
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves; every
/// index is checked.
#[target_feature(enable = "avx2,fma")]
unsafe fn strip<const R: usize, const H: usize, const CARRY: bool>(
    args: &A8Args,
    slab: Slab,
    col: usize,
    yoff: usize,
    r0: usize,
    ys: &mut [&mut [f32]],
) {
    let (n, x, g) = (args.out_feat, args.x, slab.g);
    assert!(ys.len() == R);
    let (p0, p_end) = strip_pairs(args, g, col, H * STRIP, yoff, r0, ys);
    let pairs = slab.pairs;
    // Whole groups (`CARRY` false) compile without the carry's branches.
    let (first, last) = (!CARRY || pairs.start == p0, !CARRY || pairs.end == p_end);
    assert!(CARRY || (pairs.start == p0 && pairs.end == p_end));
    assert!(p0 <= pairs.start && pairs.end <= p_end && pairs.len().is_multiple_of(BATCH_PAIRS));
    let (carry, pitch) = (slab.carry, slab.pitch);
    assert!((first && last) || (R - 1) * pitch + yoff + H * STRIP <= carry.len());
    // Raw pointers stepped along the slab (fixed trip counts, no index
    // arithmetic in the loop): the weights one row pitch per pair, each
    // row's codes two per pair. In bounds by the asserts above (`strip_pairs`).
    let base = args.data.as_ptr().wrapping_add(pairs.start * n + col);
    let xrow: [*const i8; R] =
        std::array::from_fn(|j| x.row(r0 + j).as_ptr().wrapping_add(2 * pairs.start));
    // The sums start at -8 sum(x_q), the offset of the nibbles (see the
    // module docs): the same integers as subtracting it at the end.
    let start: [[__m256i; 4]; R] =
        std::array::from_fn(|j| [_mm256_set1_epi32(-8 * x.sums[(r0 + j) * x.num_groups + g]); 4]);
    let mut acc32: [[[__m256i; 4]; R]; H] = [start; H];
    if !first {
        for (h, acc_h) in acc32.iter_mut().enumerate() {
            for (j, a) in acc_h.iter_mut().enumerate() {
                for (v, av) in a.iter_mut().enumerate() {
                    let at = j * pitch + yoff + h * STRIP + 8 * v;
                    // SAFETY: `at + 8 <= carry.len()` (asserted above).
                    *av = unsafe { _mm256_loadu_si256(carry.as_ptr().add(at) as *const __m256i) };
                }
            }
        }
    }
    for b in 0..pairs.len() / BATCH_PAIRS {
        for (h, acc_h) in acc32.iter_mut().enumerate() {
            let mut wp = base.wrapping_add(b * BATCH_PAIRS * n + h * STRIP);
            let mut xp = xrow.map(|p| p.wrapping_add(2 * b * BATCH_PAIRS));
            let mut acc16 = [[_mm256_setzero_si256(); 2]; R];
            for _ in 0..BATCH_PAIRS {
                // SAFETY: `wp` is pair p's row at column `col + 32 h` with
                // p < p_end and col + 32 H <= n, so its 32 bytes lie in
                // `data`; each `xp` points at codes 2p, 2p + 1 of its row
                // (2 p_end <= pitch).
                unsafe {
                    let [wa, wb] = decode(_mm256_loadu_si256(wp as *const __m256i));
                    for (a, x) in acc16.iter_mut().zip(xp.iter_mut()) {
                        let xv = _mm256_set1_epi16((*x as *const i16).read_unaligned());
                        a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(wa, xv));
                        a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(wb, xv));
                        *x = x.add(2);
                    }
                    wp = wp.add(n);
                }
            }
            for (a32, a16) in acc_h.iter_mut().zip(acc16.iter()) {
                // SAFETY: the features are this function's.
                unsafe { widen_add(a32, a16) };
            }
        }
    }
    if !last {
        for (h, acc_h) in acc32.iter().enumerate() {
            for (j, a) in acc_h.iter().enumerate() {
                for (v, av) in a.iter().enumerate() {
                    let at = j * pitch + yoff + h * STRIP + 8 * v;
                    // SAFETY: as for the loads above.
                    unsafe { _mm256_storeu_si256(carry.as_mut_ptr().add(at) as *mut __m256i, *av) };
                }
            }
        }
        return;
    }
    for (h, acc) in acc32.iter().enumerate() {
        // SAFETY: the features are this function's; `acc` holds a row per
        // row of `ys`, and columns yoff + 32 h .. + 32 exist (asserted).
        unsafe { epilogue(args, g, col + h * STRIP, yoff + h * STRIP, r0, acc, ys) }
    }
}

/// `y[j][yoff ..][..32] = y + f32(acc32[j]) * (scale_w[g, col ..] * d[r0 + j, g])`
/// for every row `j` of `ys`, the scalar twin's operations.
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves; every
/// index is checked.
#[target_feature(enable = "avx2,fma")]
unsafe fn epilogue(
    args: &A8Args,
    g: usize,
    col: usize,
    yoff: usize,
    r0: usize,
    acc32: &[[__m256i; 4]],
    ys: &mut [&mut [f32]],
) {
    let (n, x) = (args.out_feat, args.x);
    let srow = &args.scales[g * n + col..g * n + col + STRIP];
    assert!(acc32.len() >= ys.len() && r0 + ys.len() <= x.rows);
    for (j, (a32, y)) in acc32.iter().zip(ys.iter_mut()).enumerate() {
        let d = _mm256_set1_ps(x.d[(r0 + j) * x.num_groups + g]);
        let y = &mut y[yoff..yoff + STRIP];
        for (v, a) in a32.iter().enumerate() {
            // SAFETY: srow and y hold 32 floats; unaligned loads and stores.
            unsafe {
                let t = _mm256_mul_ps(_mm256_loadu_ps(srow.as_ptr().add(8 * v)), d);
                let accf = _mm256_cvtepi32_ps(*a);
                let yp = y.as_mut_ptr().add(8 * v);
                _mm256_storeu_ps(
                    yp,
                    _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(accf, t)),
                );
            }
        }
    }
}

/// [`strip`] for 5 to `ROW_BLOCK` rows: each batch of pairs is decoded
/// once into a buffer in L1 and read by every pass of up to four rows, so
/// the decode is paid once per strip, not once per pass.
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves; every
/// index is checked.
#[target_feature(enable = "avx2,fma")]
unsafe fn strip_block(
    args: &A8Args,
    g: usize,
    col: usize,
    yoff: usize,
    r0: usize,
    ys: &mut [&mut [f32]],
) {
    let (n, x) = (args.out_feat, args.x);
    let count = ys.len();
    assert!(count <= ROW_BLOCK);
    let (p0, p_end) = strip_pairs(args, g, col, STRIP, yoff, r0, ys);
    let mut acc32 = [[_mm256_setzero_si256(); 4]; ROW_BLOCK];
    for (j, a) in acc32.iter_mut().take(count).enumerate() {
        // The nibbles' offset, as in `strip`.
        *a = [_mm256_set1_epi32(-8 * x.sums[(r0 + j) * x.num_groups + g]); 4];
    }
    let passes = count.div_ceil(ROWS_PER_PASS);
    let mut dec = [_mm256_setzero_si256(); 2 * BATCH_PAIRS];
    for pb in (p0..p_end).step_by(BATCH_PAIRS) {
        for (k, d) in dec.chunks_exact_mut(2).enumerate() {
            // SAFETY: pair pb + k < p_end at column col + 32 <= n lies in
            // `data` (asserted in `strip_pairs`).
            let bytes = unsafe {
                _mm256_loadu_si256(args.data.as_ptr().add((pb + k) * n + col) as *const __m256i)
            };
            // SAFETY: the features are this function's.
            let [a, b] = unsafe { decode(bytes) };
            d[0] = a;
            d[1] = b;
        }
        for i in 0..passes {
            // Balanced passes (7 rows: 3 + 4), none above ROWS_PER_PASS.
            let (a, b) = (i * count / passes, (i + 1) * count / passes);
            let acc = &mut acc32[a..b];
            // SAFETY: (every arm) the features are this function's; `acc`
            // holds exactly the arm's row count, rows r0 + a .. r0 + b
            // exist and hold codes up to 2 p_end (asserted in `strip_pairs`).
            unsafe {
                match acc.len() {
                    4 => pass::<4>(&dec, x, r0 + a, pb, acc),
                    3 => pass::<3>(&dec, x, r0 + a, pb, acc),
                    2 => pass::<2>(&dec, x, r0 + a, pb, acc),
                    _ => pass::<1>(&dec, x, r0 + a, pb, acc),
                }
            }
        }
    }
    // SAFETY: as in `strip`.
    unsafe { epilogue(args, g, col, yoff, r0, &acc32[..count], ys) }
}

/// The decoded pairs `dec` (see [`decode`]) of the batch from pair `pb`
/// against the `R` rows of `x` from `r0`, added into `acc32`.
///
/// # Safety
/// None beyond the features (AVX2); the caller checks that the rows exist
/// and hold codes up to `2 (pb + BATCH_PAIRS)`.
#[target_feature(enable = "avx2,fma")]
unsafe fn pass<const R: usize>(
    dec: &[__m256i; 2 * BATCH_PAIRS],
    x: &super::xq8::Xq8,
    r0: usize,
    pb: usize,
    acc32: &mut [[__m256i; 4]],
) {
    assert!(acc32.len() == R && r0 + R <= x.rows && 2 * (pb + BATCH_PAIRS) <= x.pitch);
    let xp: [*const i8; R] = std::array::from_fn(|j| x.row(r0 + j).as_ptr().wrapping_add(2 * pb));
    let mut acc16 = [[_mm256_setzero_si256(); 2]; R];
    for (k, d) in dec.chunks_exact(2).enumerate() {
        for (a, x) in acc16.iter_mut().zip(xp.iter()) {
            // SAFETY: codes 2 (pb + k) and 2 (pb + k) + 1 of the row exist
            // (asserted above).
            let xv = _mm256_set1_epi16(unsafe { (x.add(2 * k) as *const i16).read_unaligned() });
            a[0] = _mm256_add_epi16(a[0], _mm256_maddubs_epi16(d[0], xv));
            a[1] = _mm256_add_epi16(a[1], _mm256_maddubs_epi16(d[1], xv));
        }
    }
    for (a32, a16) in acc32.iter_mut().zip(acc16.iter()) {
        // SAFETY: the features are this function's.
        unsafe { widen_add(a32, a16) };
    }
}

/// One pair row's 32 bytes as the two `vpmaddubsw` operands: columns
/// 0..7 | 16..23 and 8..15 | 24..31, each 16-bit lane holding
/// (row 2p + 8, row 2p + 1 + 8) of one column.
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode(bytes: __m256i) -> [__m256i; 2] {
    let u = _mm256_xor_si256(bytes, _mm256_set1_epi8(0x88u8 as i8));
    let low = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(u, low);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(u), low);
    [_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi)]
}

/// `a32 += widen(a16)`: columns 0..7, 8..15, 16..23, 24..31.
///
/// # Safety
/// None beyond the features (AVX2), which the caller's token proves.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_add(a32: &mut [__m256i; 4], a16: &[__m256i; 2]) {
    let halves = [
        _mm256_castsi256_si128(a16[0]),
        _mm256_castsi256_si128(a16[1]),
        _mm256_extracti128_si256::<1>(a16[0]),
        _mm256_extracti128_si256::<1>(a16[1]),
    ];
    for (v, h) in a32.iter_mut().zip(halves) {
        *v = _mm256_add_epi32(*v, _mm256_cvtepi16_epi32(h));
    }
}

/// The packed pairs `p0 .. p_end` of group `g`, once the strip's reads are
/// checked: `width` columns from `col` inside the matrix, the rows `r0 ..`
/// of `x` (one per output in `ys`, each holding `yoff + width` floats), and
/// the group's codes inside each row.
#[inline(always)]
fn strip_pairs(
    args: &A8Args,
    g: usize,
    col: usize,
    width: usize,
    yoff: usize,
    r0: usize,
    ys: &[&mut [f32]],
) -> (usize, usize) {
    let (n, x) = (args.out_feat, args.x);
    let half = args.group_size / 2;
    let (p0, p_end) = (g * half, (g + 1) * half);
    assert!(p_end * n <= args.data.len() && col + width <= n && g < x.num_groups);
    assert!(ys.iter().all(|y| y.len() >= yoff + width));
    assert!(r0 + ys.len() <= x.rows && 2 * p_end <= x.pitch);
    (p0, p_end)
}
