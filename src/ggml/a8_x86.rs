//! The AVX2 and AVX-512 VNNI bodies of `a8::dot_row_a8`, written once over
//! the integer dot ([`IntDot`]): the signed codes of a block come 32 at a
//! time in a register (`GgmlType::codes32_x86`); per 32 of them, `|q|` times `xq` with the sign
//! of `q` (`vpsignb`: exact, `|q| <= 128`, `|xq| <= 127`) gives int8 pair
//! products that `vpmaddubsw` adds into int16 without saturating
//! (`2 * 128 * 127 < 32768`), then into int32 lanes (`vpmaddwd` by ones,
//! or by the sub-block's integer scale `k_j`); VNNI fuses those steps
//! (`vpdpbusd`, `vpdpwssd`). Integer sums are exact, so any lane order
//! gives the scalar twin's value.
//!
//! The legacy types (32 weights, one scale per block) run four blocks per
//! step: one horizontal add tree gives their four sums, and the block
//! scales are converted four at a time (`vcvtph2ps`), evaluating
//! `GgmlType::a8_value`'s default with the same roundings on four lanes,
//! which are the twin's four accumulators. The k-quants (256 weights) sum
//! `k_j * dot_j` in int32 lanes, reduce once per block and call
//! `a8_value`. Up to four rows of activations go through one pass over
//! the weight row: its codes are extracted once for all of them.

use std::arch::x86_64::*;

use super::xq::XqRow;
use super::GgmlType;
use crate::simd::{Avx2F16c, Avx512Vnni};

/// The integer dot of one level.
trait IntDot {
    /// `acc` plus, per int32 lane `l`, `sum_{i < 4} q[4l + i] * x[4l + i]`.
    unsafe fn dot(acc: __m256i, q: __m256i, x: __m256i) -> __m256i;
    /// `acc` plus, per int32 lane `l`, `k[2l] * (q x)[4l..4l+2] + k[2l + 1]
    /// * (q x)[4l+2..4l+4]` (`k` int16 lanes).
    unsafe fn dot_k<T: GgmlType>(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i;
}

/// `(|q|, x * sign(q))`: the unsigned / signed operands of `vpmaddubsw`
/// and `vpdpbusd` whose products are `q * x`.
#[inline(always)]
unsafe fn signed_pair(q: __m256i, x: __m256i) -> (__m256i, __m256i) {
    // SAFETY: the callers run with AVX2.
    unsafe { (_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)) }
}

/// `vpmaddubsw`'s int16 pair sums of `q * x`: the codes as they are where
/// they are never negative (`GgmlType::A8_UNSIGNED`), else through
/// [`signed_pair`].
#[inline(always)]
pub(super) unsafe fn pair_sums<T: GgmlType>(q: __m256i, x: __m256i) -> __m256i {
    // SAFETY: the callers run with AVX2.
    unsafe {
        if T::A8_UNSIGNED {
            _mm256_maddubs_epi16(q, x)
        } else {
            let (u, s) = signed_pair(q, x);
            _mm256_maddubs_epi16(u, s)
        }
    }
}

struct Avx2Dot;

impl IntDot for Avx2Dot {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, q: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller).
        unsafe {
            let (u, s) = signed_pair(q, x);
            let p = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    }

    #[inline(always)]
    unsafe fn dot_k<T: GgmlType>(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller).
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(pair_sums::<T>(q, x), k)) }
    }
}

struct VnniDot;

impl IntDot for VnniDot {
    #[inline(always)]
    unsafe fn dot(acc: __m256i, q: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI + VL (the caller).
        unsafe {
            let (u, s) = signed_pair(q, x);
            _mm256_dpbusd_epi32(acc, u, s)
        }
    }

    #[inline(always)]
    unsafe fn dot_k<T: GgmlType>(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI + VL (the caller).
        unsafe { _mm256_dpwssd_epi32(acc, pair_sums::<T>(q, x), k) }
    }
}

/// # Safety
/// The token proves AVX2 and F16C; the caller (`a8::dot_row_a8`) checks
/// the lengths.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_avx2<T: GgmlType, const R: usize>(
    _: Avx2F16c,
    row: &[u8],
    xs: &[XqRow<'_>; R],
) -> [f32; R] {
    // SAFETY: this function's features; lengths checked by the caller.
    unsafe { dot_body::<T, Avx2Dot, R>(row, xs) }
}

/// # Safety
/// The token proves AVX-512 VNNI (with VL, AVX2 and F16C); the caller
/// checks the lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_vnni<T: GgmlType, const R: usize>(
    _: Avx512Vnni,
    row: &[u8],
    xs: &[XqRow<'_>; R],
) -> [f32; R] {
    // SAFETY: this function's features; lengths checked by the caller.
    unsafe { dot_body::<T, VnniDot, R>(row, xs) }
}

/// The sum of the eight int32 lanes of `v`.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 (the caller).
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }
}

/// The lane sums of four vectors: `[sum a, sum b, sum c, sum d]`.
#[inline(always)]
unsafe fn hsum4_i32(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> __m128i {
    // SAFETY: AVX2 (the caller).
    unsafe {
        let t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
        _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t))
    }
}

/// The halves at byte `o` of four consecutive blocks of `T` at `p`, as f32.
#[inline(always)]
unsafe fn halves4<T: GgmlType>(p: *const u8, o: usize) -> __m128 {
    // SAFETY: four blocks of `BYTES > o + 1` bytes at `p` (the caller);
    // F16C in force.
    unsafe {
        let h = |t: usize| p.add(t * T::BYTES + o).cast::<i16>().read_unaligned();
        _mm_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), 0, 0, 0, 0))
    }
}

/// The integer scales of codes `32c..32c + 32` as int16 lanes in the
/// order `vpmaddubsw` pairs them, from `k_lo` / `k_hi` (sub-blocks 0-7 /
/// 8-15 in both halves): one sub-block's `k_j` in all lanes (`SUB` 32), or
/// `k_2c` in the low half and `k_2c+1` in the high half (`SUB` 16).
#[inline(always)]
pub(super) unsafe fn k_lanes<T: GgmlType>(k_lo: __m256i, k_hi: __m256i, c: usize) -> __m256i {
    // Shuffle control: int16 lane `e` of each half in every lane.
    let pick = |e: usize| (((2 * e + 1) << 8) | (2 * e)) as i16;
    // SAFETY: AVX2 (the caller).
    unsafe {
        if T::SUB == 32 {
            _mm256_shuffle_epi8(k_lo, _mm256_set1_epi16(pick(c)))
        } else {
            let src = if c < 4 { k_lo } else { k_hi };
            let ctl = _mm256_setr_m128i(
                _mm_set1_epi16(pick((2 * c) % 8)),
                _mm_set1_epi16(pick((2 * c + 1) % 8)),
            );
            _mm256_shuffle_epi8(src, ctl)
        }
    }
}

/// The lane sums of `a` and `b`.
#[inline(always)]
unsafe fn hsum2_i32(a: __m256i, b: __m256i) -> (i32, i32) {
    // SAFETY: AVX2 (the caller).
    unsafe {
        let t = _mm256_hadd_epi32(a, b);
        let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let t = _mm_hadd_epi32(t, t);
        (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t))
    }
}

/// Chunk `c` of the block at `b` (block `bi` of the row) against every
/// row of `xs`, added into `acc` with its sub-blocks' scales: the codes
/// extracted once for all rows.
///
/// # Safety
/// As [`dot_body`]; `c < ELEMS / 32`.
#[inline(always)]
unsafe fn k_step<T: GgmlType, D: IntDot, const R: usize>(
    acc: &mut [__m256i; R],
    b: *const u8,
    xs: &[XqRow<'_>; R],
    bi: usize,
    k_lo: __m256i,
    k_hi: __m256i,
    c: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let qv = T::codes32_x86(b, c);
        let k = k_lanes::<T>(k_lo, k_hi, c);
        for (a, x) in acc.iter_mut().zip(xs) {
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(bi * T::ELEMS + 32 * c).cast());
            *a = D::dot_k::<T>(*a, qv, xv, k);
        }
    }
}

/// # Safety
/// AVX2, F16C and `D`'s features in force; `a8::dot_row_a8`'s length
/// checks hold for every row of `xs`.
#[inline(always)]
unsafe fn dot_body<T: GgmlType, D: IntDot, const R: usize>(
    row: &[u8],
    xs: &[XqRow<'_>; R],
) -> [f32; R] {
    let nb = row.len() / T::BYTES;
    let subs = T::ELEMS / T::SUB;
    let mut acc = [[0f32; 4]; R];
    let rp = row.as_ptr();
    // SAFETY: block `bi < nb` reads `BYTES` bytes of `row` at `bi * BYTES`
    // and, of every row of `xs`, `ELEMS` codes at `bi * ELEMS`, its scale
    // `d[bi]` and sums `sums[bi * subs..]`, all inside by the caller's
    // checks.
    unsafe {
        let zero = _mm256_setzero_si256();
        let mut bi = 0;
        if T::ELEMS == 32 {
            let mut acc4 = [_mm_setzero_ps(); R];
            while bi + 4 <= nb {
                let p = rp.add(bi * T::BYTES);
                let q = [
                    T::codes32_x86(p, 0),
                    T::codes32_x86(p.add(T::BYTES), 0),
                    T::codes32_x86(p.add(2 * T::BYTES), 0),
                    T::codes32_x86(p.add(3 * T::BYTES), 0),
                ];
                let d = halves4::<T>(p, 0);
                let m = if T::AFFINE { halves4::<T>(p, 2) } else { d };
                for (x, a) in xs.iter().zip(acc4.iter_mut()) {
                    let xp = x.q.as_ptr().add(bi * 32);
                    // Plain loads, not a closure: a closure would not
                    // inherit the target features.
                    let s0 = D::dot(zero, q[0], _mm256_loadu_si256(xp.cast()));
                    let s1 = D::dot(zero, q[1], _mm256_loadu_si256(xp.add(32).cast()));
                    let s2 = D::dot(zero, q[2], _mm256_loadu_si256(xp.add(64).cast()));
                    let s3 = D::dot(zero, q[3], _mm256_loadu_si256(xp.add(96).cast()));
                    let isum = _mm_cvtepi32_ps(hsum4_i32(s0, s1, s2, s3));
                    let dx = _mm_loadu_ps(x.d.as_ptr().add(bi));
                    let mut v = _mm_mul_ps(_mm_mul_ps(d, dx), isum);
                    if T::AFFINE {
                        let xsum = _mm_loadu_si128(x.sums.as_ptr().add(bi).cast());
                        let xsum = _mm_cvtepi32_ps(xsum);
                        v = _mm_add_ps(v, _mm_mul_ps(_mm_mul_ps(m, dx), xsum));
                    }
                    *a = _mm_add_ps(*a, v);
                }
                bi += 4;
            }
            for (a, a4) in acc.iter_mut().zip(acc4) {
                _mm_storeu_ps(a.as_mut_ptr(), a4);
            }
        }
        while bi < nb {
            let b = &row[bi * T::BYTES..(bi + 1) * T::BYTES];
            let (k, m) = T::a8_ints_x86(b.as_ptr());
            // `k_j` of the low / high eight sub-blocks in both 128-bit
            // halves, for the per-chunk byte shuffles.
            let (k_lo, k_hi) = (
                _mm256_permute2x128_si256::<0x00>(k, k),
                _mm256_permute2x128_si256::<0x11>(k, k),
            );
            // Two accumulators per row: independent dependency chains.
            let (mut v0, mut v1) = ([zero; R], [zero; R]);
            let mut c = 0;
            while c < T::ELEMS / 32 {
                k_step::<T, D, R>(&mut v0, b.as_ptr(), xs, bi, k_lo, k_hi, c);
                if c + 1 < T::ELEMS / 32 {
                    k_step::<T, D, R>(&mut v1, b.as_ptr(), xs, bi, k_lo, k_hi, c + 1);
                }
                c += 2;
            }
            for r in 0..R {
                let x = &xs[r];
                let v = _mm256_add_epi32(v0[r], v1[r]);
                let (isum, msum) = if T::AFFINE && T::ELEMS == 256 {
                    // m_j times the activation sums of the eight
                    // sub-blocks (the k-quants with a minimum; the legacy
                    // types have none, `a8_value` adds theirs from `xsum`).
                    let s = _mm256_loadu_si256(x.sums.as_ptr().add(bi * subs).cast());
                    hsum2_i32(v, _mm256_mullo_epi32(_mm256_cvtepi16_epi32(m), s))
                } else {
                    (hsum_i32(v), 0)
                };
                let xsum = x.sums[bi * subs..(bi + 1) * subs].iter().sum();
                acc[r][bi % 4] += T::a8_value(b, x.d[bi], isum, msum, xsum);
            }
            bi += 1;
        }
    }
    acc.map(|a| (a[0] + a[1]) + (a[2] + a[3]))
}
