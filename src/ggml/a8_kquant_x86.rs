//! The AVX2 int8-activation body of the k-quants (256 weights per block:
//! Q4_K, Q5_K, Q6_K) over [`KQUANT_ROWS`] weight rows and one activation
//! row at once (batch 1, where each weight row is read once per call).
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

/// Weight rows one pass of [`dot_rows8_kquant_avx2`] serves.
pub(super) const KQUANT_ROWS: usize = 8;

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

/// Row `w`'s int32 lane vectors of block `bi` (at `b`): `sum_j k_j dot_j`
/// and, for the types with a minimum, `m_j * sums_j` per sub-block.
///
/// # Safety
/// As [`dot_rows8_kquant_avx2`]; `b` is block `bi` of a row.
#[inline(always)]
unsafe fn row_block<T: GgmlType>(b: *const u8, x: &XqRow<'_>, bi: usize) -> (__m256i, __m256i) {
    // SAFETY: the caller's contract: the block's bytes and block `bi` of
    // `x` (its 256 codes and its sub-block sums) are inside.
    unsafe {
        let (k, m) = T::a8_ints_x86(b);
        let (k_lo, k_hi) = (
            _mm256_permute2x128_si256::<0x00>(k, k),
            _mm256_permute2x128_si256::<0x11>(k, k),
        );
        let xp = x.q.as_ptr().add(bi * T::ELEMS);
        // Two chains: independent adds.
        let (mut v0, mut v1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let mut c = 0;
        // No closure for the step: it would not inherit the target
        // features, and its intrinsics would not inline.
        while c < T::ELEMS / 32 {
            let x0 = _mm256_loadu_si256(xp.add(32 * c).cast());
            let x1 = _mm256_loadu_si256(xp.add(32 * c + 32).cast());
            let p0 = pair_sums::<T>(T::codes32_x86(b, c), x0);
            let p1 = pair_sums::<T>(T::codes32_x86(b, c + 1), x1);
            v0 = _mm256_add_epi32(v0, _mm256_madd_epi16(p0, k_lanes::<T>(k_lo, k_hi, c)));
            v1 = _mm256_add_epi32(v1, _mm256_madd_epi16(p1, k_lanes::<T>(k_lo, k_hi, c + 1)));
            c += 2;
        }
        let mv = if T::AFFINE {
            let s = _mm256_loadu_si256(x.sums.as_ptr().add(bi * (T::ELEMS / T::SUB)).cast());
            _mm256_mullo_epi32(_mm256_cvtepi16_epi32(m), s)
        } else {
            _mm256_setzero_si256()
        };
        (_mm256_add_epi32(v0, v1), mv)
    }
}

/// `rows[w] . x` for the [`KQUANT_ROWS`] weight rows of `rows` (each
/// `stride` bytes of whole blocks of `T`, a k-quant of
/// [`has_kquant_body`]) and one activation row.
///
/// # Safety
/// The token proves AVX2, FMA and F16C; `T::ELEMS == 256` and
/// `has_kquant_body(T::GGML_TYPE)`; `rows` holds eight rows of `stride`
/// bytes; `x` is a row of an `Xq` of `T` for `stride / T::BYTES` blocks
/// (the checks of `a8::dot_row_a8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows8_kquant_avx2<T: GgmlType>(
    _: Avx2F16c,
    rows: &[u8],
    stride: usize,
    x: XqRow<'_>,
) -> [f32; KQUANT_ROWS] {
    debug_assert!(T::ELEMS == 256 && rows.len() == KQUANT_ROWS * stride);
    let nb = stride / T::BYTES;
    let mut acc = [_mm256_setzero_ps(); 4];
    let p = rows.as_ptr();
    // SAFETY: block `bi < nb` of row `w < 8` is `BYTES` bytes at
    // `w * stride + bi * BYTES`, inside `rows`; the rest is the caller's
    // contract.
    unsafe {
        for bi in 0..nb {
            let pb = p.add(bi * T::BYTES);
            let mut isums = [_mm256_setzero_si256(); 8];
            let mut msums = [_mm256_setzero_si256(); 8];
            for w in 0..8 {
                (isums[w], msums[w]) = row_block::<T>(pb.add(w * stride), &x, bi);
            }
            let isum = lane_sums8(&isums);
            let msum = if T::AFFINE { lane_sums8(&msums) } else { isum };
            let dx = _mm256_set1_ps(x.d[bi]);
            let v = block_values::<T>(pb, stride, dx, isum, msum);
            acc[bi % 4] = _mm256_add_ps(acc[bi % 4], v);
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut out = [0f32; KQUANT_ROWS];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out
    }
}
