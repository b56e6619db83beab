//! The AVX2 int8-activation body of the k-quants (256 weights per block:
//! Q6_K, and Q4_K / Q5_K at one activation row; with more, those two go
//! through `a8_kquant_lanes_x86.rs`) over [`KQUANT_ROWS`] weight rows and
//! up to four activation rows at once: each row's codes and scales are
//! extracted once per block for all activation rows.
//!
//! Per block, each row's `sum_j k_j dot_j` (and, with a minimum, its
//! `m_j * sum_j(xq)` products) accumulate in int32 lanes as in the one-row
//! body (`a8_x86.rs`); the eight rows' lane vectors then fold in one
//! `vphaddd` tree ([`lane_sums8`]) into one register whose lane `w` is row
//! `w`'s exact `isum` (`msum`), and the block value ([`block_values`],
//! each type's `GgmlType::a8_value` with the same roundings) runs on the
//! eight lanes into four accumulators by block index mod 4: lane `w` is
//! row `w`'s accumulator of the scalar twin (`a8::dot_row_a8_scalar`), so
//! every result is the twin's bit for bit.

use std::arch::x86_64::*;

use super::a8_legacy_x86::{halves8, lane_sums8};
use super::a8_x86::{k_lanes, pair_sums};
use super::xq::XqRow;
use super::GgmlType;
use crate::simd::Avx2F16c;
use q4k_row::{pair_activations, row_isums, scale_bytes, Q4_K_TYPE};

// Q4_K's one-activation-row step, in its own file; a child module, so that
// it needs no line in `ggml/mod.rs`.
#[path = "a8_q4k_row_x86.rs"]
mod q4k_row;

/// Weight rows one pass of [`dot_rows8_kquant_avx2`] serves.
pub(super) const KQUANT_ROWS: usize = 8;

/// How many blocks ahead the k-quant bodies prefetch their rows.
const PREFETCH_BLOCKS: usize = 2;

/// Asks for block `bi + PREFETCH_BLOCKS` (when there is one, `nb` blocks a
/// row) of each of eight rows `stride` bytes apart from `rows`, one request
/// per 64-byte line: eight rows stream at once, more than the hardware
/// prefetcher follows from DRAM (Q6_K from DRAM ran 1.1-2.1x faster with it).
#[inline(always)]
pub(super) fn prefetch_eight_rows_ahead<T: GgmlType>(
    rows: &[u8],
    stride: usize,
    bi: usize,
    nb: usize,
) {
    if bi + PREFETCH_BLOCKS >= nb {
        return;
    }
    let ahead = rows
        .as_ptr()
        .wrapping_add((bi + PREFETCH_BLOCKS) * T::BYTES);
    for w in 0..8 {
        let mut o = 0;
        while o < T::BYTES {
            // SAFETY: SSE is part of x86_64; a prefetch reads nothing into
            // the program and cannot fault, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(w * stride + o).cast()) };
            o += 64;
        }
    }
}

/// Whether [`block_values`] has `T`'s block value (by ggml type number:
/// Q4_K 12, Q5_K 13, Q6_K 14).
pub(super) const fn has_kquant_body(ggml_type: u32) -> bool {
    matches!(ggml_type, 12..=14)
}

/// The k-quant block values of eight rows (lanes) against an activation
/// block of scale `dx`: Q4_K / Q5_K `(d dx) isum - (dmin dx) msum` (`d`,
/// `dmin` the halves at bytes 0 and 2, `k_scales::k_a8_value`), Q6_K
/// `(d dx) isum` (`d` the half at byte 208).
///
/// # Safety
/// AVX2 and F16C in force; the eight blocks at `p + w * stride` readable.
#[inline(always)]
unsafe fn block_values<T: GgmlType>(
    p: *const u8,
    stride: usize,
    dx: __m256,
    isum: __m256i,
    msum: __m256i,
) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        if T::GGML_TYPE == 14 {
            let d = halves8(p, stride, 208);
            _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum))
        } else {
            let d = halves8(p, stride, 0);
            let dmin = halves8(p, stride, 2);
            _mm256_sub_ps(
                _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum)),
                _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum)),
            )
        }
    }
}

/// The offset that makes a k-quant's codes unsigned for `vpmaddubsw`, by
/// ggml type number: Q6_K stores `q + 32` in `0..=63` (its 6-bit field);
/// Q4_K and Q5_K store their codes as they are (`GgmlType::A8_UNSIGNED`).
/// With the offset, a block's sum is corrected by `32 * sum_j k_j sums_j`
/// (exact), instead of moving the sign of `q` onto `x` per 32 codes and
/// activation row (`vpabsb`, `vpsignb`).
pub(super) const fn kquant_code_bias(ggml_type: u32) -> Option<i8> {
    match ggml_type {
        14 => Some(32),
        _ => None,
    }
}

/// An activation row's sixteen sub-block sums of block `bi` as int16 lanes
/// in sub-block order (each at most `16 * 127` in magnitude), for the
/// Q6_K offset correction.
///
/// # Safety
/// AVX2 in force; `x.sums` holds 16 sums at `16 * bi`.
#[inline(always)]
unsafe fn sums16(x: &XqRow<'_>, bi: usize) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let sp = x.sums.as_ptr().add(16 * bi);
        let lo = _mm256_loadu_si256(sp.cast());
        let hi = _mm256_loadu_si256(sp.add(8).cast());
        // `vpackssdw` packs per 128-bit half: sums 0-3, 8-11, 4-7, 12-15;
        // the 64-bit permute puts them back in order (exact: |s| < 2^15).
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi))
    }
}

/// Row `w`'s int32 lane vectors of block `bi` (at `b`) against each row
/// `r` of `xs`, into `isums[r][w]` / `msums[r][w]`: `sum_j k_j dot_j` and,
/// for the types with a minimum, `m_j * sums_j` per sub-block. The codes
/// and scales are extracted once for all rows of `xs`; `xsums[r]` is row
/// `r`'s [`sums16`] (Q6_K only).
///
/// # Safety
/// As [`dot_rows8_kquant_avx2`]; `b` is block `bi` of a row, `w < 8`.
#[inline(always)]
unsafe fn row_block<T: GgmlType, const R: usize>(
    b: *const u8,
    xs: &[XqRow<'_>; R],
    xsums: &[__m256i; R],
    bi: usize,
    w: usize,
    isums: &mut [[__m256i; 8]; R],
    msums: &mut [[__m256i; 8]; R],
) {
    // SAFETY: the caller's contract: the block's bytes and block `bi` of
    // each row of `xs` (its 256 codes and its sub-block sums) are inside.
    // No closures: they would not inherit the target features, and their
    // intrinsics would not inline.
    unsafe {
        let bias = kquant_code_bias(T::GGML_TYPE);
        let (k, m) = T::a8_ints_x86(b);
        let (k_lo, k_hi) = (
            _mm256_permute2x128_si256::<0x00>(k, k),
            _mm256_permute2x128_si256::<0x11>(k, k),
        );
        let mut v = [_mm256_setzero_si256(); R];
        for c in 0..T::ELEMS / 32 {
            let q = T::codes32_x86(b, c);
            let kc = k_lanes::<T>(k_lo, k_hi, c);
            for r in 0..R {
                let xv = _mm256_loadu_si256(xs[r].q.as_ptr().add(bi * T::ELEMS + 32 * c).cast());
                // `|(q + 32) pair| <= 2 * 63 * 127`: no saturation.
                let p = match bias {
                    Some(o) => _mm256_maddubs_epi16(_mm256_add_epi8(q, _mm256_set1_epi8(o)), xv),
                    None => pair_sums::<T>(q, xv),
                };
                v[r] = _mm256_add_epi32(v[r], _mm256_madd_epi16(p, kc));
            }
        }
        if let Some(o) = bias {
            // `o * k_j` fits int16 (`|k_j| <= 128`), its products with the
            // sums int32.
            let ko = _mm256_mullo_epi16(k, _mm256_set1_epi16(i16::from(o)));
            for r in 0..R {
                v[r] = _mm256_sub_epi32(v[r], _mm256_madd_epi16(ko, xsums[r]));
            }
        }
        let m32 = _mm256_cvtepi16_epi32(m);
        for r in 0..R {
            isums[r][w] = v[r];
            if T::AFFINE {
                let sp = xs[r].sums.as_ptr().add(bi * (T::ELEMS / T::SUB));
                let s = _mm256_loadu_si256(sp.cast());
                msums[r][w] = _mm256_mullo_epi32(m32, s);
            }
        }
    }
}

/// `rows[w] . xs[r]` for the [`KQUANT_ROWS`] weight rows of `rows` (each
/// `stride` bytes of whole blocks of `T`, a k-quant of
/// [`has_kquant_body`]) and the `R` activation rows `xs`, as `out[r][w]`.
///
/// # Safety
/// The token proves AVX2, FMA and F16C; `T::ELEMS == 256` and
/// `has_kquant_body(T::GGML_TYPE)`; `rows` holds eight rows of `stride`
/// bytes; every row of `xs` is of an `Xq` of `T` for `stride / T::BYTES`
/// blocks (the checks of `a8::dot_row_a8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows8_kquant_avx2<T: GgmlType, const R: usize>(
    _: Avx2F16c,
    rows: &[u8],
    stride: usize,
    xs: &[XqRow<'_>; R],
) -> [[f32; KQUANT_ROWS]; R] {
    debug_assert!(T::ELEMS == 256 && rows.len() == KQUANT_ROWS * stride);
    let nb = stride / T::BYTES;
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let p = rows.as_ptr();
    // SAFETY: block `bi < nb` of row `w < 8` is `BYTES` bytes at
    // `w * stride + bi * BYTES`, inside `rows`; the rest is the caller's
    // contract.
    unsafe {
        for bi in 0..nb {
            let pb = p.add(bi * T::BYTES);
            prefetch_eight_rows_ahead::<T>(rows, stride, bi, nb);
            let mut isums = [[_mm256_setzero_si256(); 8]; R];
            let mut msums = isums;
            let mut xsums = [_mm256_setzero_si256(); R];
            if kquant_code_bias(T::GGML_TYPE).is_some() {
                for (s, x) in xsums.iter_mut().zip(xs) {
                    *s = sums16(x, bi);
                }
            }
            if R == 1 && T::GGML_TYPE == Q4_K_TYPE {
                // Two sub-blocks per register (`a8_q4k_row_x86.rs`): the
                // activations arranged once per block for the eight rows.
                let xv = pair_activations(&xs[0], bi);
                let s = _mm256_loadu_si256(xs[0].sums.as_ptr().add(bi * 8).cast());
                for w in 0..8 {
                    let b = pb.add(w * stride);
                    let (kb, m) = scale_bytes(b);
                    isums[0][w] = row_isums(b, &xv, kb);
                    msums[0][w] = _mm256_mullo_epi32(m, s);
                }
            } else {
                for w in 0..8 {
                    let b = pb.add(w * stride);
                    row_block::<T, R>(b, xs, &xsums, bi, w, &mut isums, &mut msums);
                }
            }
            for r in 0..R {
                let isum = lane_sums8(&isums[r]);
                let msum = if T::AFFINE {
                    lane_sums8(&msums[r])
                } else {
                    isum
                };
                let dx = _mm256_set1_ps(xs[r].d[bi]);
                let v = block_values::<T>(pb, stride, dx, isum, msum);
                acc[r][bi % 4] = _mm256_add_ps(acc[r][bi % 4], v);
            }
        }
        let mut out = [[0f32; KQUANT_ROWS]; R];
        for r in 0..R {
            let a = &acc[r];
            let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            _mm256_storeu_ps(out[r].as_mut_ptr(), s);
        }
        out
    }
}
