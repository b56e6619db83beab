//! The AVX2 int8-activation body of the legacy types (32 weights and one
//! scale per block: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) over [`LEGACY_ROWS`]
//! weight rows at once: each activation load serves eight weight rows and
//! each code extraction serves up to eight activation rows, and the eight
//! rows' float work runs on the eight lanes of one register.
//!
//! Per block and activation row, the eight rows' exact block sums land in
//! the int32 lanes of one register, lane `w` for row `w` ([`block_isums`]:
//! codes transposed once per block for several activation rows, two rows
//! per register for one row of the 4- and 5-bit types, a `vphaddd` tree for
//! one row of Q8_0); `GgmlType::a8_value`'s
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
use pairs::{nibble_layout, pair_isums};

// The one-activation-row step of the 4- and 5-bit types, in its own file;
// a child module, so that it needs no line in `ggml/mod.rs`.
#[path = "a8_legacy_pairs_x86.rs"]
mod pairs;

/// Where a Q8_0 block (ggml type 8, `{ f16 d; i8 qs[32] }`) keeps its 32
/// codes.
const Q8_0_CODES: Option<usize> = Some(2);

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

/// How many `vpmaddubsw` results (int16 pair sums) of a type may add in
/// int16 lanes without overflow: each is at most `2 * top * 127` in
/// magnitude, with `top` the largest unsigned operand (15 for the 4-bit
/// codes of Q4_0 / Q4_1, 31 for the 5-bit ones, 128 for `|q|` of Q8_0), so
/// `floor(32767 / (254 * top))` of them: 8, 4 and 1.
pub(super) const fn int16_terms(ggml_type: u32) -> usize {
    let top = match ggml_type {
        2 | 3 => 15,
        6 | 7 => 31,
        _ => 128,
    };
    32767 / (254 * top)
}

/// The 4 x 4 transposes of int32 lanes within each 128-bit half: in half
/// `h`, lane `w` of result `k` is lane `k` of that half of `v[w]` (unpack
/// 32, then unpack 64; no lane-crossing step).
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
pub(super) unsafe fn transpose4_in_halves(v: &[__m256i; 4]) -> [__m256i; 4] {
    // SAFETY: the caller's contract.
    unsafe {
        // Per half: `a` = `[v0[0], v1[0], v0[1], v1[1]]`, `b` the same of
        // lanes 2 and 3; `c`, `d` the same of `v2`, `v3`.
        let a = _mm256_unpacklo_epi32(v[0], v[1]);
        let b = _mm256_unpackhi_epi32(v[0], v[1]);
        let c = _mm256_unpacklo_epi32(v[2], v[3]);
        let d = _mm256_unpackhi_epi32(v[2], v[3]);
        [
            _mm256_unpacklo_epi64(a, c),
            _mm256_unpackhi_epi64(a, c),
            _mm256_unpacklo_epi64(b, d),
            _mm256_unpackhi_epi64(b, d),
        ]
    }
}

/// The 32 bytes at `o` of the eight blocks `p + w * stride` in row lanes:
/// result `k` holds bytes `4k..4k + 4` (bytes `16 + 4(k - 4)..` for `k >=
/// 4`, that is `4k..4k + 4` of the 32) of row `w` in int32 lane `w`.
///
/// # Safety
/// AVX2 in force; 32 readable bytes at each `p + w * stride + o`.
#[inline(always)]
pub(super) unsafe fn row_lanes(p: *const u8, stride: usize, o: usize) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        // `y[w]`: bytes 0-15 of rows `w` (low half) and `w + 4` (high half);
        // `z[w]` bytes 16-31. The in-half transpose then puts row `w` (and
        // `w + 4`) in lane `w` of each half. Loops, not closures: a closure
        // would not inherit the caller's target features.
        let at = |w: usize, h: usize| p.add(w * stride + o + 16 * h).cast::<__m128i>();
        let (mut y, mut z) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
        for w in 0..4 {
            y[w] = _mm256_loadu2_m128i(at(w + 4, 0), at(w, 0));
            z[w] = _mm256_loadu2_m128i(at(w + 4, 1), at(w, 1));
        }
        let (ty, tz) = (transpose4_in_halves(&y), transpose4_in_halves(&z));
        [ty[0], ty[1], ty[2], ty[3], tz[0], tz[1], tz[2], tz[3]]
    }
}

/// The 8 x 8 transpose of int32 lanes: lane `w` of result `k` is lane `k`
/// of `v[w]` ([`transpose4_in_halves`] of rows 0-3 and 4-7, then the
/// 128-bit halves).
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
pub(super) unsafe fn transpose8_epi32(v: &[__m256i; 8]) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        // `lo[k]`: lane `k` (low half) / `4 + k` (high half) of rows 0-3;
        // `hi[k]` the same of rows 4-7.
        let lo = transpose4_in_halves(&[v[0], v[1], v[2], v[3]]);
        let hi = transpose4_in_halves(&[v[4], v[5], v[6], v[7]]);
        let mut out = [_mm256_setzero_si256(); 8];
        for k in 0..4 {
            out[k] = _mm256_permute2x128_si256::<0x20>(lo[k], hi[k]);
            out[4 + k] = _mm256_permute2x128_si256::<0x31>(lo[k], hi[k]);
        }
        out
    }
}

/// The eight rows' exact block sums of `u * xq` (`u = q + bias`, or `q`
/// for Q8_0) against each row of `xs`, lane `w` for row `w`, into
/// `isums[r]`: by transposed codes ([`transposed_isums`]) for several
/// activation rows, by row pairs (`a8_legacy_pairs_x86.rs`) or one
/// `vphaddd` tree ([`hsum_isums`], Q8_0) for one.
///
/// # Safety
/// As [`dot_rows8_avx2`]; `bi` a block of the rows.
#[inline(always)]
unsafe fn block_isums<T: GgmlType, const R: usize>(
    p: *const u8,
    stride: usize,
    xs: &[XqRow<'_>; R],
    bi: usize,
) -> [__m256i; R] {
    // SAFETY: the caller's contract.
    unsafe {
        if R == 1 {
            let s = if nibble_layout(T::GGML_TYPE).is_some() {
                pair_isums::<T>(p, stride, &xs[0], bi)
            } else {
                hsum_isums::<T>(p, stride, &xs[0], bi)
            };
            [s; R]
        } else {
            transposed_isums::<T, R>(p, stride, xs, bi)
        }
    }
}

/// [`block_isums`] for one activation row: per weight row `w` its int32
/// lane vector (`vpmaddubsw`, `vpmaddwd` by ones), the eight folded by
/// [`lane_sums8`].
///
/// # Safety
/// As [`block_isums`].
#[inline(always)]
unsafe fn hsum_isums<T: GgmlType>(
    p: *const u8,
    stride: usize,
    x: &XqRow<'_>,
    bi: usize,
) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let bias = code_bias(T::GGML_TYPE);
        let xv = _mm256_loadu_si256(x.q.as_ptr().add(bi * 32).cast());
        let ones = _mm256_set1_epi16(1);
        let mut dots = [_mm256_setzero_si256(); 8];
        for (w, dw) in dots.iter_mut().enumerate() {
            let q = T::codes32_x86(p.add(w * stride), 0);
            // The operands of `vpmaddubsw`: `(q + bias, xq)`, or
            // `(|q|, xq sign(q))`.
            let (u, s) = match bias {
                Some(c) => (_mm256_add_epi8(q, _mm256_set1_epi8(c)), xv),
                None => (_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q)),
            };
            *dw = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
        }
        lane_sums8(&dots)
    }
}

/// [`block_isums`] for several activation rows. The eight rows' codes are
/// transposed once per block (int32 lane `w` of `t[k]` holds codes
/// `4k..4k + 4` of row `w`), so that per activation row `vpmaddubsw` of
/// `t[k]` with the broadcast activation bytes `4k..4k + 4` puts row `w`'s
/// products in int16 lanes `2w, 2w + 1`: up to [`int16_terms`] of those
/// add in int16, one `vpmaddwd` by ones then leaves row `w`'s exact block
/// sum in int32 lane `w`, with no horizontal sums per activation row.
///
/// # Safety
/// As [`block_isums`].
#[inline(always)]
unsafe fn transposed_isums<T: GgmlType, const R: usize>(
    p: *const u8,
    stride: usize,
    xs: &[XqRow<'_>; R],
    bi: usize,
) -> [__m256i; R] {
    // SAFETY: the caller's contract.
    unsafe {
        // No closures here: a closure does not inherit the caller's target
        // features, so the intrinsics in it would not inline.
        if let Some(o) = Q8_0_CODES.filter(|_| T::GGML_TYPE == 8) {
            return q8_0_isums::<R>(p.add(o), stride, xs, bi);
        }
        let bias = code_bias(T::GGML_TYPE);
        let terms = int16_terms(T::GGML_TYPE);
        // `t`: the codes (`q + bias`, or signed `q`) by row in lanes; `u`
        // the unsigned operand of `vpmaddubsw` (`q + bias`, or `|q|`).
        let t = {
            let mut q = [_mm256_setzero_si256(); 8];
            for (w, qw) in q.iter_mut().enumerate() {
                *qw = T::codes32_x86(p.add(w * stride), 0);
                if let Some(c) = bias {
                    *qw = _mm256_add_epi8(*qw, _mm256_set1_epi8(c));
                }
            }
            transpose8_epi32(&q)
        };
        let mut u = t;
        if bias.is_none() {
            for k in 0..8 {
                u[k] = _mm256_abs_epi8(t[k]);
            }
        }
        let ones = _mm256_set1_epi16(1);
        let mut out = [_mm256_setzero_si256(); R];
        for (isum, x) in out.iter_mut().zip(xs) {
            let xp = x.q.as_ptr().add(bi * 32).cast::<i32>();
            let mut k = 0;
            while k < 8 {
                let mut s16 = _mm256_setzero_si256();
                for j in k..k + terms {
                    let xv = _mm256_set1_epi32(xp.add(j).read_unaligned());
                    let s = if bias.is_some() {
                        xv
                    } else {
                        _mm256_sign_epi8(xv, t[j])
                    };
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[j], s));
                }
                *isum = _mm256_add_epi32(*isum, _mm256_madd_epi16(s16, ones));
                k += terms;
            }
        }
        out
    }
}

/// [`transposed_isums`] for Q8_0, whose 32 codes per block are signed
/// bytes as stored (at `q`, rows `stride` apart): four bytes of each of
/// the eight rows by int32 lane (two 16-byte loads per register and the
/// in-half transpose, as [`row_lanes`]), then per activation row
/// `vpsignb`, `vpmaddubsw` and `vpmaddwd` by ones (a pair sum of `|q|
/// <= 128` may reach `32512`, so none add in int16). Codes outer,
/// activation rows inner, one 16-byte half of the block at a time: four
/// code registers and their absolute values live at once. With all eight
/// and their absolute values live (sixteen registers) the four-row body
/// spilled them, 519 stack accesses in its loop on Zen 3 (`perf
/// annotate`), and batch 4 took 1.2-1.9x ggml's time.
///
/// # Safety
/// As [`block_isums`], with `q` the codes of block `bi` of row 0.
#[inline(always)]
unsafe fn q8_0_isums<const R: usize>(
    q: *const u8,
    stride: usize,
    xs: &[XqRow<'_>; R],
    bi: usize,
) -> [__m256i; R] {
    // SAFETY: the caller's contract: 32 code bytes at `q + w * stride`,
    // `w < 8`, and block `bi` of every row of `xs`.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut out = [_mm256_setzero_si256(); R];
        for h in 0..2 {
            let at = |w: usize| q.add(w * stride + 16 * h).cast::<__m128i>();
            let mut y = [_mm256_setzero_si256(); 4];
            for (w, yw) in y.iter_mut().enumerate() {
                *yw = _mm256_loadu2_m128i(at(w + 4), at(w));
            }
            // `t[k]` lane `w`: bytes `16h + 4k..16h + 4k + 4` of row `w`.
            let t = transpose4_in_halves(&y);
            for (k, &tk) in t.iter().enumerate() {
                let u = _mm256_abs_epi8(tk);
                let j = 4 * h + k;
                for (isum, x) in out.iter_mut().zip(xs) {
                    let xj = x.q.as_ptr().add(bi * 32 + 4 * j).cast::<i32>();
                    let s = _mm256_sign_epi8(_mm256_set1_epi32(xj.read_unaligned()), tk);
                    let d = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
                    *isum = _mm256_add_epi32(*isum, d);
                }
            }
        }
        out
    }
}

/// One block `bi` of the eight rows at `p` (block `bi` of row 0; rows
/// `stride` bytes apart) against every row of `xs`, added into `acc[r]`:
/// [`block_isums`], the offset correction `bias * sum(xq)`, then
/// `GgmlType::a8_value`'s default lane by lane.
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
        let bias = code_bias(T::GGML_TYPE);
        let isums = block_isums::<T, R>(p, stride, xs, bi);
        let d = halves8(p, stride, 0);
        let m = if T::AFFINE { halves8(p, stride, 2) } else { d };
        for ((a, x), mut isum) in acc.iter_mut().zip(xs).zip(isums) {
            let xsum = x.sums[bi];
            if let Some(c) = bias {
                if c != 0 {
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(i32::from(c) * xsum));
                }
            }
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
