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
//!   subtracted per weight: each row's chain starts from `-bias * sum(x)`
//!   of the block, formed once per pass for all its rows;
//! - the halves `d` are converted with F16C (`vcvtph2ps` of a broadcast
//!   half), exact for every finite half; `bad_scale` refuses the others at
//!   load;
//! - the minimum's term of Q4_1 / Q5_1 is `m * sum(x)` per block: the 32-sum
//!   of each block of `x` is formed once per call (`SUMS`), and per block and
//!   row one 4-lane FMA of the converted `(d, m)` pair against the broadcast
//!   sum (lane 1 carries `m * sum(x)`) replaces a second broadcast half and
//!   an 8-lane FMA (on Zen 3, one thread, paired with the body that did
//!   that: Q4_1 7-20 % and Q5_1 5-11 % less time per call);
//! - a full pass prefetches the next pass's rows, as far ahead in them as
//!   it is in its own (Q8_0 4-12 % less time, the others within the noise).
//!
//! Tried on the same machine and no faster (within the noise of the paired
//! runs): converting a pass's halves 8 at a time into a buffer first, the
//! pass's `(d, m)` pairs gathered into one vector and converted at once, 6
//! or 8 rows per pass, two product chains per row and block, two or four
//! blocks per loop step (the scale FMAs after both blocks' chains), and
//! Q4_0's offset moved from the chains into the minimum's lane.
//!
//! Rounding: per block and row one f32 chain per lane over the terms
//! `n_i x_i` and `-bias x_i` (the latter through `sum(x)`: two adds per
//! lane, times a power of two), one FMA with `d`, one add per block into the
//! row's total; for the types with a minimum, each block's `sum(x)` in 31
//! adds (5 per input), one FMA with `m` and one add per block into the
//! row's minimum lane; one horizontal sum per row and one add of the two.
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
    if !T::AFFINE {
        return passes::<T>(t, data, row_bytes, r0, x, &[], out);
    }
    SUMS.with(|sums| {
        let mut sums = sums.borrow_mut();
        // SAFETY: the token proves AVX2 and FMA; `x` is whole blocks.
        unsafe { fill_sums(t, x, &mut sums) };
        passes::<T>(t, data, row_bytes, r0, x, &sums, out);
    });
}

thread_local! {
    /// Each thread's block sums of `x` (the types with a minimum), refilled
    /// in place on every call: no allocation per call once grown (the row
    /// engine calls once per task of 4 to 64 rows).
    static SUMS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `sums[k] = sum(x[32k..32k + 32])`: four vectors added in a tree, then
/// the horizontal sum (5 adds per input).
///
/// # Safety
/// None beyond the token; `x.len()` a multiple of 32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_sums(_: Avx2F16c, x: &[f32], sums: &mut Vec<f32>) {
    sums.resize(x.len() / 32, 0.0);
    for (s, xb) in sums.iter_mut().zip(x.chunks_exact(32)) {
        // SAFETY: `xb` holds 32 floats.
        unsafe {
            let p = xb.as_ptr();
            let a = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            let b = _mm256_add_ps(_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
            *s = _mm256_add_ps(a, b).hsum();
        }
    }
}

/// The passes of up to `ROWS` rows over `x` (`sums`: its block sums, for
/// the types with a minimum; empty otherwise).
fn passes<T: GgmlType>(
    t: Avx2F16c,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    sums: &[f32],
    out: &mut [f32],
) {
    assert!(!T::AFFINE || sums.len() == x.len() / 32);
    for (p, o) in out.chunks_mut(ROWS).enumerate() {
        let first = (r0 + p * ROWS) * row_bytes;
        let at = |i: usize| data[first + i * row_bytes..].as_ptr();
        // The next pass's rows, contiguous after this pass's (only
        // prefetched: the address need not be inside `data`).
        let next = data.as_ptr().wrapping_add(first + ROWS * row_bytes);
        let rows = Rows { x, sums, next };
        // SAFETY: (every arm) the token proves AVX2, FMA and F16C; each
        // row starts `row_bytes` readable bytes (asserted by `dot_rows`),
        // the whole blocks that `x` spans; `sums` as asserted above.
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
    /// The block sums of `x` (types with a minimum), else empty.
    sums: &'a [f32],
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

/// The dots of `R` rows (see the module docs).
///
/// # Safety
/// None beyond the token (AVX2, FMA, F16C); each row has `x.len() / 32 *
/// BYTES` readable bytes, `x.len()` a multiple of 32; for a type with a
/// minimum `rows.sums` holds `x.len() / 32` sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<T: GgmlType, const R: usize>(
    _: Avx2F16c,
    rows: &Rows,
    at: [*const u8; R],
) -> [f32; R] {
    let bias = T::LEGACY.bias();
    let px = rows.x.as_ptr();
    let mut tot = [_mm256_setzero_ps(); R];
    let mut mins = [_mm_setzero_ps(); R];
    for k in 0..rows.x.len() / 32 {
        if R == ROWS {
            let ahead = rows.next.wrapping_add(k * R * T::BYTES);
            for l in 0..(R * T::BYTES).div_ceil(64) {
                // A prefetch never faults, whatever the address.
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64 * l).cast());
            }
        }
        // SAFETY: the block's 32 inputs are inside `x`, its bytes inside
        // each row and its sum inside `sums` (the function's contract).
        unsafe {
            let xb = px.add(32 * k);
            let xv = [
                _mm256_loadu_ps(xb),
                _mm256_loadu_ps(xb.add(8)),
                _mm256_loadu_ps(xb.add(16)),
                _mm256_loadu_ps(xb.add(24)),
            ];
            // The chains' start: `-bias * sum(x)` (exact: bias is 8 or 16).
            let start = if bias != 0 {
                let s = _mm256_add_ps(_mm256_add_ps(xv[0], xv[1]), _mm256_add_ps(xv[2], xv[3]));
                _mm256_mul_ps(s, _mm256_set1_ps(-f32::from(bias)))
            } else {
                _mm256_setzero_ps()
            };
            let sum = if T::AFFINE {
                _mm_broadcast_ss(&*rows.sums.as_ptr().add(k))
            } else {
                _mm_setzero_ps()
            };
            for i in 0..R {
                let b = at[i].add(k * T::BYTES);
                let (lo0, hi0) = codes8::<T>(b, 0);
                let (lo1, hi1) = codes8::<T>(b, 1);
                let p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo0), xv[0], start);
                let p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi0), xv[2], p);
                let p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo1), xv[1], p);
                let p = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi1), xv[3], p);
                if T::AFFINE {
                    // `(d, m, 0, 0)` from the halves at bytes 0 and 2: lane
                    // 1 of `mins` gathers `m * sum(x)` (lane 0 `d * sum(x)`,
                    // not used).
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(b.cast::<i32>().read_unaligned()));
                    tot[i] = _mm256_fmadd_ps(p, _mm256_broadcastss_ps(dm), tot[i]);
                    mins[i] = _mm_fmadd_ps(dm, sum, mins[i]);
                } else {
                    tot[i] = _mm256_fmadd_ps(p, half8(b), tot[i]);
                }
            }
        }
    }
    let mut out = [0f32; R];
    for ((o, t), m) in out.iter_mut().zip(tot).zip(mins) {
        // SAFETY: AVX2 is enabled.
        *o = unsafe {
            if T::AFFINE {
                t.hsum() + _mm_cvtss_f32(_mm_movehdup_ps(m))
            } else {
                t.hsum()
            }
        };
    }
    out
}
