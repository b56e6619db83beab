//! The AVX2 int8-activation body of Q4_K and Q5_K with the weight rows in
//! lanes: eight weight rows and up to [`LANES_PASS_ROWS`] activation rows
//! per pass, each activation row's products landing in int16 lanes
//! `2w, 2w + 1` of their weight row `w`, so a block needs no horizontal
//! sums (the k-quant body of `a8_kquant_x86.rs` folds eight int32 vectors
//! per block and activation row instead).
//!
//! Per block, once for the eight weight rows:
//! - the code bytes are transposed by 32-bit groups ([`row_lanes`]): after
//!   it, register `k` holds bytes `4k..4k + 4` of every row, row `w` in
//!   int32 lane `w` (rows 0-3 in the low 128-bit half, 4-7 in the high
//!   half, which the loads arrange: no lane-crossing shuffle). A byte's
//!   low and high nibbles are codes of two sub-blocks at the same place,
//!   so one transpose serves both; Q5_K's fifth-bit bytes go through the
//!   same transpose.
//! - the 6-bit scales and minimums of the eight rows are transposed into
//!   per-sub-block registers ([`scale_columns`]): `sc_j` of row `w` in
//!   int16 lanes `2w, 2w + 1`, and `m_2p, m_2p+1` of row `w` in lanes `2w`,
//!   `2w + 1`.
//!
//! Per activation row and sub-block `j`: `vpmaddubsw` of register `k` with
//! the broadcast activation bytes `32j + 4k..+4` (eight of them, summed in
//! int16: `8 * 2 * 15 * 127 < 32768` for Q4_K, four at a time for Q5_K's
//! 5-bit codes), one `vpmaddwd` by the `sc_j` lanes, into int32 lane `w`:
//! row `w`'s exact `isum` (ggml's `vec_dot_q4_K_q8_K` integers). The
//! minimum term `msum = sum_j m_j sums_j` is four `vpmaddwd` of the
//! minimum pairs with the activation row's sub-block sums, the q8_K
//! `bsums` idea. The block value and the four accumulators by block index
//! mod 4 then run on the eight lanes with `k_scales::k_a8_value`'s
//! roundings, so lane `w` is the scalar twin's (`a8::dot_row_a8_scalar`)
//! accumulator of row `w`, bit for bit.
//!
//! Loop order: sub-block outer, activation row inner, so the codes of a
//! sub-block are in registers once for all activation rows; the rows'
//! int32 sums live in a small array (L1).

use std::arch::x86_64::*;

use super::a8_kquant_x86::prefetch_eight_rows_ahead;
use super::a8_legacy_x86::{halves8, row_lanes};
use super::k_scales::k_a8_bytes_x86;
use super::xq::XqRow;
use super::GgmlType;
use crate::simd::Avx2F16c;

/// Weight rows one pass of [`dot_rows8_lanes_avx2`] serves: the lanes of
/// one f32 register.
pub(super) const LANES_ROWS: usize = 8;

/// Most activation rows one pass of [`dot_rows8_lanes_avx2`] serves: the
/// block's transposed codes and scales are built once for all of them.
pub(super) const LANES_PASS_ROWS: usize = 16;

/// Where a block of the types of this body keeps its code nibbles and
/// fifth bits, by ggml type number (ggml-common.h): Q4_K `qs` at 16, Q5_K
/// `qh` at 16 and `qs` at 48; `None` for the other types.
pub(super) const fn lanes_layout(ggml_type: u32) -> Option<(usize, Option<usize>)> {
    match ggml_type {
        12 => Some((16, None)),
        13 => Some((48, Some(16))),
        _ => None,
    }
}

/// How many `vpmaddubsw` results of a sub-block add in int16 lanes: each is
/// at most `2 * top * 127`, `top` the largest code (15 for Q4_K, 31 for
/// Q5_K), so `floor(32767 / (254 * top))` of them, at most the eight a
/// sub-block has: 8 and 4.
pub(super) const fn lanes_int16_terms(ggml_type: u32) -> usize {
    let top = if ggml_type == 13 { 31 } else { 15 };
    let n = 32767 / (254 * top);
    if n > 8 {
        8
    } else {
        n
    }
}

/// The eight rows' 6-bit scales and minimums of one block as the integer
/// operands of [`dot_rows8_lanes_avx2`]: `k[j]` has `sc_j` of row `w` in
/// int16 lanes `2w, 2w + 1`; `m[p]` has `m_2p` and `m_2p+1` of row `w` in
/// lanes `2w` and `2w + 1`.
///
/// # Safety
/// AVX2 in force; a Q4_K / Q5_K block at each `p + w * stride`.
#[inline(always)]
unsafe fn scale_columns(p: *const u8, stride: usize) -> ([__m256i; 8], [__m256i; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        // `v[w]`: `sc_0..7, m_0..7` of row `w` as bytes; a byte transpose
        // (8, 16, 32-bit unpacks) makes `c[i]` = `sc_2i` of rows 0-7, then
        // `sc_2i+1` of rows 0-7 (`i < 4`), and `c[4 + i]` the same of `m`.
        let mut v = [_mm_setzero_si128(); 8];
        for (w, vw) in v.iter_mut().enumerate() {
            *vw = k_a8_bytes_x86(p.add(w * stride));
        }
        let mut c = [_mm_setzero_si128(); 8];
        for (half, ch) in c.chunks_exact_mut(4).enumerate() {
            let mut b = [_mm_setzero_si128(); 4];
            for (i, bi) in b.iter_mut().enumerate() {
                *bi = if half == 0 {
                    _mm_unpacklo_epi8(v[2 * i], v[2 * i + 1])
                } else {
                    _mm_unpackhi_epi8(v[2 * i], v[2 * i + 1])
                };
            }
            // Items 0-3 and 4-7 of rows 0-3, then of rows 4-7.
            let (lo03, hi03) = (
                _mm_unpacklo_epi16(b[0], b[1]),
                _mm_unpackhi_epi16(b[0], b[1]),
            );
            let (lo47, hi47) = (
                _mm_unpacklo_epi16(b[2], b[3]),
                _mm_unpackhi_epi16(b[2], b[3]),
            );
            ch[0] = _mm_unpacklo_epi32(lo03, lo47);
            ch[1] = _mm_unpackhi_epi32(lo03, lo47);
            ch[2] = _mm_unpacklo_epi32(hi03, hi47);
            ch[3] = _mm_unpackhi_epi32(hi03, hi47);
        }
        let mut k = [_mm256_setzero_si256(); 8];
        for (j, kj) in k.iter_mut().enumerate() {
            let col = c[j / 2];
            let twice = if j.is_multiple_of(2) {
                _mm_unpacklo_epi8(col, col)
            } else {
                _mm_unpackhi_epi8(col, col)
            };
            *kj = _mm256_cvtepu8_epi16(twice);
        }
        let mut m = [_mm256_setzero_si256(); 4];
        for (i, mi) in m.iter_mut().enumerate() {
            let col = c[4 + i];
            *mi = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(col, _mm_srli_si128::<8>(col)));
        }
        (k, m)
    }
}

/// Sub-block `j`'s codes from the row-lane bytes `raw` (low nibbles for
/// even `j`, high for odd) and, for Q5_K, bit `j` of the row-lane
/// fifth-bit bytes `high` moved to bit 4.
///
/// # Safety
/// AVX2 in force.
#[inline(always)]
unsafe fn sub_block_codes(
    raw: &[__m256i; 8],
    high: Option<&[__m256i; 8]>,
    j: usize,
) -> [__m256i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let bit4 = _mm256_set1_epi8(0x10);
        let mut q = [_mm256_setzero_si256(); 8];
        for (qk, &r) in q.iter_mut().zip(raw) {
            *qk = if j.is_multiple_of(2) {
                _mm256_and_si256(r, m4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(r), m4)
            };
        }
        if let Some(h) = high {
            // A 16-bit shift by `4 - j` moves bit `j` of each byte to bit 4
            // of the same byte; the bits it brings in from the other byte
            // land elsewhere than bit 4 (`j < 8`), which the mask drops.
            let (left, right) = (4usize.saturating_sub(j), j.saturating_sub(4));
            let (left, right) = (
                _mm_cvtsi32_si128(left as i32),
                _mm_cvtsi32_si128(right as i32),
            );
            for (qk, &hk) in q.iter_mut().zip(h) {
                let b = _mm256_srl_epi16(_mm256_sll_epi16(hk, left), right);
                *qk = _mm256_or_si256(*qk, _mm256_and_si256(b, bit4));
            }
        }
        q
    }
}

/// `rows[w] . xs[r]` for the [`LANES_ROWS`] weight rows of `rows` (each
/// `stride` bytes of whole blocks of `T`, Q4_K or Q5_K) and the activation
/// rows `xs` (at most [`LANES_PASS_ROWS`]), into `out[r]`.
///
/// # Safety
/// The token proves AVX2, FMA and F16C; `lanes_layout(T::GGML_TYPE)` is
/// `Some`; `rows` holds eight rows of `stride` bytes; every row of `xs` is
/// of an `Xq` of `T` for `stride / T::BYTES` blocks (the checks of
/// `a8::dot_row_a8`); `out.len() == xs.len() <= LANES_PASS_ROWS`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows8_lanes_avx2<T: GgmlType>(
    _: Avx2F16c,
    rows: &[u8],
    stride: usize,
    xs: &[XqRow<'_>],
    out: &mut [[f32; LANES_ROWS]],
) {
    let n = xs.len();
    debug_assert!(T::ELEMS == 256 && rows.len() == LANES_ROWS * stride);
    debug_assert!(n <= LANES_PASS_ROWS && out.len() == n);
    let Some((qs, qh)) = lanes_layout(T::GGML_TYPE) else {
        unreachable!("dot_rows8_lanes_avx2 of a type without its layout")
    };
    let terms = lanes_int16_terms(T::GGML_TYPE);
    let nb = stride / T::BYTES;
    let zero = _mm256_setzero_ps();
    let mut acc = [[zero; 4]; LANES_PASS_ROWS];
    let p = rows.as_ptr();
    // SAFETY: block `bi < nb` of row `w < 8` is `BYTES` bytes at
    // `w * stride + bi * BYTES`, inside `rows`; the activation codes, scale
    // and sums of block `bi` of every row of `xs` are inside by the
    // caller's checks.
    unsafe {
        for bi in 0..nb {
            let pb = p.add(bi * T::BYTES);
            prefetch_eight_rows_ahead::<T>(rows, stride, bi, nb);
            let (k, m) = scale_columns(pb, stride);
            // A match, not `Option::map`: a closure would not inherit this
            // function's target features, so `row_lanes` would not inline.
            #[allow(clippy::manual_map)]
            let high = match qh {
                Some(o) => Some(row_lanes(pb, stride, o)),
                None => None,
            };
            let mut isum = [_mm256_setzero_si256(); LANES_PASS_ROWS];
            for g in 0..4 {
                let raw = row_lanes(pb, stride, qs + 32 * g);
                for j in [2 * g, 2 * g + 1] {
                    let q = sub_block_codes(&raw, high.as_ref(), j);
                    for (s, x) in isum.iter_mut().zip(xs) {
                        let xp = x.q.as_ptr().add(bi * 256 + 32 * j).cast::<i32>();
                        let mut kk = 0;
                        while kk < 8 {
                            let mut s16 = _mm256_setzero_si256();
                            for (t, &qt) in q.iter().enumerate().skip(kk).take(terms) {
                                let xv = _mm256_set1_epi32(xp.add(t).read_unaligned());
                                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(qt, xv));
                            }
                            *s = _mm256_add_epi32(*s, _mm256_madd_epi16(s16, k[j]));
                            kk += terms;
                        }
                    }
                }
            }
            // The block values, `k_scales::k_a8_value` lane by lane.
            let d = halves8(pb, stride, 0);
            let dmin = halves8(pb, stride, 2);
            for ((a, x), &is) in acc.iter_mut().zip(xs).zip(&isum) {
                // The activation row's eight sub-block sums (each at most
                // `32 * 127`: exact in int16) in int16 lanes, the pair
                // `2p, 2p + 1` broadcast against `m[p]`.
                let sp = x.sums.as_ptr().add(8 * bi);
                let s16 = _mm_packs_epi32(
                    _mm_loadu_si128(sp.cast()),
                    _mm_loadu_si128(sp.add(4).cast()),
                );
                let s16 = _mm256_broadcastsi128_si256(s16);
                let ms = _mm256_add_epi32(
                    _mm256_add_epi32(
                        _mm256_madd_epi16(m[0], _mm256_shuffle_epi32::<0x00>(s16)),
                        _mm256_madd_epi16(m[1], _mm256_shuffle_epi32::<0x55>(s16)),
                    ),
                    _mm256_add_epi32(
                        _mm256_madd_epi16(m[2], _mm256_shuffle_epi32::<0xAA>(s16)),
                        _mm256_madd_epi16(m[3], _mm256_shuffle_epi32::<0xFF>(s16)),
                    ),
                );
                let dx = _mm256_set1_ps(x.d[bi]);
                let v = _mm256_sub_ps(
                    _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(is)),
                    _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(ms)),
                );
                a[bi % 4] = _mm256_add_ps(a[bi % 4], v);
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            _mm256_storeu_ps(o.as_mut_ptr(), s);
        }
    }
}
