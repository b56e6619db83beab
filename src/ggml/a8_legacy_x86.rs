//! The AVX2 int8-activation body of the legacy types (32 weights and one
//! scale per block: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) over [`LEGACY_ROWS`]
//! weight rows at once: each activation load serves eight weight rows and
//! each code extraction serves up to four activation rows, and the eight
//! rows' float work runs on the eight lanes of one register.
//!
//! Per block and activation row, the eight rows' integer dots (int32 lanes
//! from `vpmaddubsw` / `vpmaddwd`) fold in one `vphaddd` tree into one
//! register whose lane `w` is row `w`'s exact block sum; `GgmlType::a8_value`'s
//! default then runs on the eight lanes with the same roundings, into four
//! accumulators by block index mod 4 (lane `w` is row `w`'s accumulator of
//! the scalar twin, `a8::dot_row_a8_scalar`). So every result is the
//! twin's bit for bit: the integer sums are exact in any order.
//!
//! The codes go to `vpmaddubsw` unsigned where the type has an offset form
//! ([`code_bias`]: `q + bias` in `0..=31`, the sum then corrected by
//! `bias * sum(xq)`, exact), which saves moving the sign of `q` onto `x` per
//! activation row; Q8_0's codes are full signed bytes and keep that step.

use std::arch::x86_64::*;

use super::xq::XqRow;
use super::GgmlType;
use crate::simd::Avx2F16c;

/// Weight rows one pass of [`dot_rows8_avx2`] serves: the lanes of one
/// f32 register.
pub(super) const LEGACY_ROWS: usize = 8;

/// The offset that makes a legacy type's codes unsigned, by ggml type
/// number (ggml-common.h's layouts): Q4_0 stores `q + 8` and Q5_0 `q + 16`
/// in `0..=31`, Q4_1 and Q5_1 store their codes as they are (`0..=31`);
/// Q8_0 (and any other type) has none.
pub(super) const fn code_bias(ggml_type: u32) -> Option<i8> {
    match ggml_type {
        2 => Some(8),
        6 => Some(16),
        3 | 7 => Some(0),
        _ => None,
    }
}

/// The halves at byte `o` of the blocks at `p + w * stride`, `w < 8`, as
/// f32 lanes.
///
/// # Safety
/// F16C in force; two readable bytes at each `p + w * stride + o`.
#[inline(always)]
pub(super) unsafe fn halves8(p: *const u8, stride: usize, o: usize) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let h = |w: usize| p.add(w * stride + o).cast::<i16>().read_unaligned();
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }
}

/// Lane `w` of the result is the sum of the eight int32 lanes of `v[w]`.
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
pub(super) unsafe fn lane_sums8(v: &[__m256i; 8]) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        // Per 128-bit half: [v0, v1, v2, v3] after two levels, each a
        // partial sum of that half; the halves then add across.
        let a = _mm256_hadd_epi32(v[0], v[1]);
        let b = _mm256_hadd_epi32(v[2], v[3]);
        let c = _mm256_hadd_epi32(v[4], v[5]);
        let d = _mm256_hadd_epi32(v[6], v[7]);
        let ab = _mm256_hadd_epi32(a, b);
        let cd = _mm256_hadd_epi32(c, d);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(ab, cd),
            _mm256_permute2x128_si256::<0x31>(ab, cd),
        )
    }
}

/// One block `bi` of the eight rows at `p` (block `bi` of row 0; rows
/// `stride` bytes apart) against every row of `xs`, added into `acc[r]`.
///
/// # Safety
/// As [`dot_rows8_avx2`]; `bi` a block of the rows.
#[inline(always)]
unsafe fn block_step<T: GgmlType, const R: usize>(
    acc: &mut [__m256; R],
    p: *const u8,
    stride: usize,
    xs: &[XqRow<'_>; R],
    bi: usize,
) {
    // SAFETY: the caller's contract: the eight blocks and block `bi` of
    // every row of `xs` are inside their slices.
    unsafe {
        // No closures here: a closure does not inherit the caller's target
        // features, so the intrinsics in it would not inline.
        let bias = code_bias(T::GGML_TYPE);
        let mut q = [_mm256_setzero_si256(); 8];
        // The unsigned operand of `vpmaddubsw`: `q + bias`, or `|q|`.
        let mut u = q;
        for w in 0..8 {
            q[w] = T::codes32_x86(p.add(w * stride), 0);
            u[w] = match bias {
                Some(c) => _mm256_add_epi8(q[w], _mm256_set1_epi8(c)),
                None => _mm256_abs_epi8(q[w]),
            };
        }
        let d = halves8(p, stride, 0);
        let m = if T::AFFINE { halves8(p, stride, 2) } else { d };
        let ones = _mm256_set1_epi16(1);
        for (a, x) in acc.iter_mut().zip(xs) {
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(bi * 32).cast());
            let mut dots = [_mm256_setzero_si256(); 8];
            for w in 0..8 {
                let s = if bias.is_some() {
                    xv
                } else {
                    _mm256_sign_epi8(xv, q[w])
                };
                dots[w] = _mm256_madd_epi16(_mm256_maddubs_epi16(u[w], s), ones);
            }
            let xsum = x.sums[bi];
            let mut isum = lane_sums8(&dots);
            if let Some(c) = bias {
                if c != 0 {
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(i32::from(c) * xsum));
                }
            }
            // `GgmlType::a8_value`'s default, lane by lane.
            let dx = _mm256_set1_ps(x.d[bi]);
            let mut v = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum));
            if T::AFFINE {
                let t = _mm256_mul_ps(_mm256_mul_ps(m, dx), _mm256_set1_ps(xsum as f32));
                v = _mm256_add_ps(v, t);
            }
            *a = _mm256_add_ps(*a, v);
        }
    }
}

/// `rows[w] . xs[r]` for the [`LEGACY_ROWS`] weight rows of `rows` (each
/// `stride` bytes of whole blocks of `T`, a legacy type) and the `R`
/// activation rows `xs`, as `out[r][w]`.
///
/// # Safety
/// The token proves AVX2, FMA and F16C; `T::ELEMS == 32`; `rows` holds
/// eight rows of `stride` bytes; every row of `xs` is of an `Xq` of `T`
/// for `stride / T::BYTES` blocks (the checks of `a8::dot_row_a8`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows8_avx2<T: GgmlType, const R: usize>(
    _: Avx2F16c,
    rows: &[u8],
    stride: usize,
    xs: &[XqRow<'_>; R],
) -> [[f32; LEGACY_ROWS]; R] {
    debug_assert!(T::ELEMS == 32 && rows.len() == LEGACY_ROWS * stride);
    let nb = stride / T::BYTES;
    let zero = _mm256_setzero_ps();
    // Four accumulators by block index mod 4, as the scalar twin.
    let (mut a0, mut a1, mut a2, mut a3) = ([zero; R], [zero; R], [zero; R], [zero; R]);
    let p = rows.as_ptr();
    // SAFETY: block `bi < nb` of row `w < 8` is `BYTES` bytes at
    // `w * stride + bi * BYTES`, inside `rows`; the rest is the caller's
    // contract.
    unsafe {
        let mut bi = 0;
        while bi + 4 <= nb {
            let pb = p.add(bi * T::BYTES);
            block_step::<T, R>(&mut a0, pb, stride, xs, bi);
            block_step::<T, R>(&mut a1, pb.add(T::BYTES), stride, xs, bi + 1);
            block_step::<T, R>(&mut a2, pb.add(2 * T::BYTES), stride, xs, bi + 2);
            block_step::<T, R>(&mut a3, pb.add(3 * T::BYTES), stride, xs, bi + 3);
            bi += 4;
        }
        let pb = p.add(bi * T::BYTES);
        if bi < nb {
            block_step::<T, R>(&mut a0, pb, stride, xs, bi);
        }
        if bi + 1 < nb {
            block_step::<T, R>(&mut a1, pb.add(T::BYTES), stride, xs, bi + 1);
        }
        if bi + 2 < nb {
            block_step::<T, R>(&mut a2, pb.add(2 * T::BYTES), stride, xs, bi + 2);
        }
        let mut out = [[0f32; LEGACY_ROWS]; R];
        for (r, o) in out.iter_mut().enumerate() {
            let s = _mm256_add_ps(_mm256_add_ps(a0[r], a1[r]), _mm256_add_ps(a2[r], a3[r]));
            _mm256_storeu_ps(o.as_mut_ptr(), s);
        }
        out
    }
}
