//! The AVX2 and AVX-512 VNNI bodies of `a8::dot_row_a8`, written once over
//! the integer dot ([`IntDot`]): the signed codes of a block come from
//! `GgmlType::codes_x86`; per 32 of them, `|q|` times `xq` with the sign
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
//! `a8_value`.

use std::arch::x86_64::*;

use super::a8::{block_sums, XqRow};
use super::{Codes, GgmlType, MAX_BLOCK_ELEMS};
use crate::simd::{Avx2F16c, Avx512Vnni};

/// The integer dot of one level.
trait IntDot {
    /// `acc` plus, per int32 lane `l`, `sum_{i < 4} q[4l + i] * x[4l + i]`.
    unsafe fn dot(acc: __m256i, q: __m256i, x: __m256i) -> __m256i;
    /// `acc` plus, per int32 lane `l`, `k[2l] * (q x)[4l..4l+2] + k[2l + 1]
    /// * (q x)[4l+2..4l+4]` (`k` int16 lanes).
    unsafe fn dot_k(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i;
}

/// `(|q|, x * sign(q))`: the unsigned / signed operands of `vpmaddubsw`
/// and `vpdpbusd` whose products are `q * x`.
#[inline(always)]
unsafe fn signed_pair(q: __m256i, x: __m256i) -> (__m256i, __m256i) {
    // SAFETY: the callers run with AVX2.
    unsafe { (_mm256_abs_epi8(q), _mm256_sign_epi8(x, q)) }
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
    unsafe fn dot_k(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller).
        unsafe {
            let (u, s) = signed_pair(q, x);
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), k))
        }
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
    unsafe fn dot_k(acc: __m256i, q: __m256i, x: __m256i, k: __m256i) -> __m256i {
        // SAFETY: AVX-512 VNNI + VL (the caller).
        unsafe {
            let (u, s) = signed_pair(q, x);
            _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(u, s), k)
        }
    }
}

/// # Safety
/// The token proves AVX2 and F16C; the caller (`a8::dot_row_a8`) checks
/// the lengths.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_row_avx2<T: GgmlType>(_: Avx2F16c, row: &[u8], x: XqRow<'_>) -> f32 {
    // SAFETY: this function's features; lengths checked by the caller.
    unsafe { dot_body::<T, Avx2Dot>(row, x) }
}

/// # Safety
/// The token proves AVX-512 VNNI (with VL, AVX2 and F16C); the caller
/// checks the lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot_row_vnni<T: GgmlType>(_: Avx512Vnni, row: &[u8], x: XqRow<'_>) -> f32 {
    // SAFETY: this function's features; lengths checked by the caller.
    unsafe { dot_body::<T, VnniDot>(row, x) }
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

/// The integer scales of 32 codes starting at sub-block `32 c / SUB`, as
/// int16 lanes in the order `vpmaddubsw` pairs them.
#[inline(always)]
unsafe fn k_lanes<T: GgmlType>(k: &[i16], c: usize) -> __m256i {
    // SAFETY: AVX2 (the caller).
    unsafe {
        if T::SUB == 32 {
            _mm256_set1_epi16(k[c])
        } else {
            _mm256_setr_m128i(_mm_set1_epi16(k[2 * c]), _mm_set1_epi16(k[2 * c + 1]))
        }
    }
}

/// # Safety
/// AVX2, F16C and `D`'s features in force; `a8::dot_row_a8`'s length
/// checks hold.
#[inline(always)]
unsafe fn dot_body<T: GgmlType, D: IntDot>(row: &[u8], x: XqRow<'_>) -> f32 {
    let nb = row.len() / T::BYTES;
    let subs = T::ELEMS / T::SUB;
    let mut buf: Codes = [0; MAX_BLOCK_ELEMS];
    let mut acc = [0f32; 4];
    let (rp, xp) = (row.as_ptr(), x.q.as_ptr());
    // SAFETY: block `bi < nb` reads `BYTES` bytes of `row` at `bi * BYTES`
    // and `ELEMS` codes of `x.q` at `bi * ELEMS`, its scale `x.d[bi]` and
    // sums `x.sums[bi * subs..]`, all inside by the caller's checks; the
    // codes buffer holds 256 bytes (32 per block of four legacy blocks).
    unsafe {
        let mut bi = 0;
        if T::ELEMS == 32 {
            let mut acc4 = _mm_setzero_ps();
            while bi + 4 <= nb {
                let p = rp.add(bi * T::BYTES);
                let s: [__m256i; 4] = std::array::from_fn(|t| {
                    let q = T::codes_x86(p.add(t * T::BYTES), buf.as_mut_ptr().add(32 * t));
                    let qv = _mm256_loadu_si256(q.cast());
                    let xv = _mm256_loadu_si256(xp.add((bi + t) * 32).cast());
                    D::dot(_mm256_setzero_si256(), qv, xv)
                });
                let isum = _mm_cvtepi32_ps(hsum4_i32(s[0], s[1], s[2], s[3]));
                let dx = _mm_loadu_ps(x.d.as_ptr().add(bi));
                let mut v = _mm_mul_ps(_mm_mul_ps(halves4::<T>(p, 0), dx), isum);
                if T::AFFINE {
                    let xs = _mm_cvtepi32_ps(_mm_loadu_si128(x.sums.as_ptr().add(bi).cast()));
                    v = _mm_add_ps(v, _mm_mul_ps(_mm_mul_ps(halves4::<T>(p, 2), dx), xs));
                }
                acc4 = _mm_add_ps(acc4, v);
                bi += 4;
            }
            _mm_storeu_ps(acc.as_mut_ptr(), acc4);
        }
        while bi < nb {
            let b = &row[bi * T::BYTES..(bi + 1) * T::BYTES];
            let q = T::codes_x86(b.as_ptr(), buf.as_mut_ptr());
            let (k, m) = T::a8_ints(b);
            let xb = xp.add(bi * T::ELEMS);
            // Two accumulators: two independent dependency chains.
            let (mut v0, mut v1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let mut c = 0;
            while c < T::ELEMS / 32 {
                let load = |c: usize| {
                    (
                        _mm256_loadu_si256(q.add(32 * c).cast()),
                        _mm256_loadu_si256(xb.add(32 * c).cast()),
                    )
                };
                let (qv, xv) = load(c);
                v0 = D::dot_k(v0, qv, xv, k_lanes::<T>(&k, c));
                if c + 1 < T::ELEMS / 32 {
                    let (qv, xv) = load(c + 1);
                    v1 = D::dot_k(v1, qv, xv, k_lanes::<T>(&k, c + 1));
                }
                c += 2;
            }
            let isum = hsum_i32(_mm256_add_epi32(v0, v1));
            let (msum, xsum) = block_sums::<T>(&m[..subs], &x.sums[bi * subs..(bi + 1) * subs]);
            acc[bi % 4] += T::a8_value(b, x.d[bi], isum, msum, xsum);
            bi += 1;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}
