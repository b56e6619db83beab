//! AVX2 + FMA dot-product kernels of the linear layers' forward engine,
//! callable only with an [`Avx2`] token (the E4M3 dot with [`Avx2F16c`];
//! its decode is described in `avx512.rs`). The f32 and int8 dots are the
//! bodies of `dots.rs` over `__m256`.

use std::arch::x86_64::*;

use super::dots;
use super::format::dot_e4m3_scalar;
use crate::simd::{Avx2, Avx2F16c, F32Lanes};

/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_f32(_: Avx2, a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the token proves the features of `__m256`'s lanes.
    unsafe { dots::dot_f32::<__m256>(a, b) }
}

/// Not a body shared with AVX-512 over `F32Lanes`: the decode widens
/// through different halves per width, and each loop's step and prefetch
/// are tuned to its width (docs/benchmarks.md, "FP8 batch 1").
///
/// # Safety
/// None beyond the token: it proves AVX2, FMA and F16C. NaN codes give a meaningless sum (layers reject them).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_e4m3(_: Avx2F16c, codes: &[u8], x: &[f32]) -> f32 {
    assert_eq!(codes.len(), x.len());
    let n = codes.len() / 32 * 32;
    let (pc, px) = (codes.as_ptr(), x.as_ptr());
    // Four accumulators: an FMA's latency is four cycles, so two chains
    // (16 codes per four cycles) held one core to ~12 GB/s of codes, under
    // half of what two cores can stream.
    let mut s = [_mm256_setzero_ps(); 4];
    let mask = _mm256_set1_epi16(0xBF80u16 as i16);
    let mut i = 0;
    while i < n {
        // Codes 2 KiB ahead, one prefetch per 64-byte line (see avx512.rs).
        if i % 64 == 0 {
            _mm_prefetch::<_MM_HINT_T0>(pc.wrapping_add(i + 2048).cast());
        }
        for half in 0..2 {
            let j = i + 16 * half;
            // SAFETY: j + 16 <= n <= codes.len() == x.len().
            unsafe {
                // See `avx512::dot_e4m3` for the sign-extend-and-shift decode.
                let c = _mm256_cvtepi8_epi16(_mm_loadu_si128(pc.add(j).cast()));
                let h = _mm256_and_si256(_mm256_slli_epi16::<7>(c), mask);
                let w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                let w1 = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
                s[2 * half] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px.add(j)), s[2 * half]);
                s[2 * half + 1] =
                    _mm256_fmadd_ps(w1, _mm256_loadu_ps(px.add(j + 8)), s[2 * half + 1]);
            }
        }
        i += 32;
    }
    let s = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
    // SAFETY: this function's features include AVX2.
    let t = unsafe { s.hsum() } * 256.0;
    t + dot_e4m3_scalar(&codes[n..], &x[n..])
}

/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_i8(_: Avx2, q: &[i8], x: &[f32]) -> f32 {
    // SAFETY: the token proves the features of `__m256`'s lanes.
    unsafe { dots::dot_i8::<__m256>(q, x) }
}

/// `part[i][j] = xs[i] . ws[j]`, 16 ymm accumulators.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot4x4(_: Avx2, xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
    // SAFETY: the token proves the features of `__m256`'s lanes.
    unsafe { dots::dot4x4::<__m256>(xs, ws, part) }
}

/// `panel[i * width + c] = rows[c * kc + i]` for the 8 rows `c` of `rows`
/// (each `kc` long) and every `i < kc`: the GEMM panel's input-major layout
/// from 8 decoded weight rows, 8 x 8 blocks transposed in registers (two
/// rounds of unpack / shuffle within 128-bit lanes, then the lane
/// exchange), the `kc % 8` tail element by element. Moves values only, so
/// the panel holds exactly what the scalar scatter writes.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose8(_: Avx2, rows: &[f32], kc: usize, panel: &mut [f32], width: usize) {
    assert!(width >= 8 && rows.len() >= 8 * kc && (kc == 0 || panel.len() >= (kc - 1) * width + 8));
    let full = kc / 8 * 8;
    let (src, dst) = (rows.as_ptr(), panel.as_mut_ptr());
    for i0 in (0..full).step_by(8) {
        // SAFETY: row c's loads read rows[c * kc + i0 .. + 8] with i0 + 8 <=
        // kc, and the stores write panel[(i0 + i) * width .. + 8] with i0 +
        // i < kc (asserted above).
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|c| _mm256_loadu_ps(src.add(c * kc + i0)));
            let cols = transpose_8x8(r);
            for (i, v) in cols.iter().enumerate() {
                _mm256_storeu_ps(dst.add((i0 + i) * width), *v);
            }
        }
    }
    for i in full..kc {
        for c in 0..8 {
            panel[i * width + c] = rows[c * kc + i];
        }
    }
}

/// The 8 x 8 transpose of `r` (`out[i]` lane `c` = `r[c]` lane `i`): two
/// rounds of unpack / shuffle within 128-bit lanes, then the lane exchange.
#[target_feature(enable = "avx2")]
fn transpose_8x8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// The 8 x 8 byte transpose of the low 8 bytes of each `r[c]`: `out[p]`
/// holds column `2p` (bytes 0..8: byte `c` = `r[c]` byte `2p`) and column
/// `2p + 1` (bytes 8..16). Bytes, then 16-bit pairs, then 32-bit quads
/// interleaved: three rounds of four unpacks.
#[target_feature(enable = "avx2")]
fn transpose_8x8_bytes(r: [__m128i; 8]) -> [__m128i; 4] {
    let a01 = _mm_unpacklo_epi8(r[0], r[1]);
    let a23 = _mm_unpacklo_epi8(r[2], r[3]);
    let a45 = _mm_unpacklo_epi8(r[4], r[5]);
    let a67 = _mm_unpacklo_epi8(r[6], r[7]);
    // Columns 0..4 (lo) and 4..8 (hi) of rows 0..4 and of rows 4..8.
    let b0 = _mm_unpacklo_epi16(a01, a23);
    let b1 = _mm_unpackhi_epi16(a01, a23);
    let b2 = _mm_unpacklo_epi16(a45, a67);
    let b3 = _mm_unpackhi_epi16(a45, a67);
    [
        _mm_unpacklo_epi32(b0, b2),
        _mm_unpackhi_epi32(b0, b2),
        _mm_unpacklo_epi32(b1, b3),
        _mm_unpackhi_epi32(b1, b3),
    ]
}

/// `panel[i * width + c] = E4M3(codes[c * ldc + i])` for the 8 rows `c`
/// and every `i < kc`: the GEMM panel of 8 weight rows straight from their
/// codes, with no f32 copy of the rows in between. Per step, 8 codes of
/// each of the 8 rows are transposed as bytes ([`transpose_8x8_bytes`]:
/// twelve 128-bit unpacks, against the 24 shuffles an 8 x 8 f32 transpose
/// takes), so each register then holds two panel rows (16 codes) that
/// decode together in 256-bit halves: a code becomes a float16 (`sign <<
/// 15 | magnitude << 7`, the value times 2^-8, subnormals included; see
/// `avx512.rs`), widens exactly to f32 and is multiplied by 2^8 (exact).
/// The `kc % 8` tail decodes through `table`. Equals the table's decode bit
/// for bit on every code but the NaNs (which the layers reject). The codes
/// of the next 8 rows (`8 * ldc` on) are prefetched as it goes.
///
/// # Safety
/// None beyond the token: it proves AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn e4m3_panel8(
    _: Avx2F16c,
    codes: &[u8],
    ldc: usize,
    kc: usize,
    panel: &mut [f32],
    width: usize,
    table: &[f32; 256],
) {
    assert!(width >= 8 && (kc == 0 || codes.len() >= 7 * ldc + kc));
    assert!(kc == 0 || panel.len() >= (kc - 1) * width + 8);
    let full = kc / 8 * 8;
    let (src, dst) = (codes.as_ptr(), panel.as_mut_ptr());
    let mask = _mm256_set1_epi16(0xBF80u16 as i16);
    let two8 = _mm256_set1_ps(256.0);
    for i0 in (0..full).step_by(8) {
        if i0 % 64 == 0 {
            // The same inputs of the next 8 rows: what the GEMM's next call
            // decodes (the panel's next 8 columns). The codes come from
            // L3 or DRAM, 8 rows apart; without the hint the decode ran at
            // about 0.24 ns a weight from beyond L2 on Zen 3, with it 0.16
            // (the next 64 bytes of the same rows: 0.20).
            for c in 8..16 {
                // A prefetch never faults: the address may lie past the
                // codes (wrapping_add computes it without a dereference).
                _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(c * ldc + i0).cast());
            }
        }
        // SAFETY: row c's load reads codes[c * ldc + i0 .. + 8] with i0 + 8
        // <= kc, and the stores write panel[(i0 + i) * width .. + 8] with
        // i0 + i < kc (asserted above).
        unsafe {
            let r: [__m128i; 8] =
                std::array::from_fn(|c| _mm_loadl_epi64(src.add(c * ldc + i0).cast()));
            for (p, pair) in transpose_8x8_bytes(r).iter().enumerate() {
                let w = _mm256_cvtepi8_epi16(*pair);
                let h = _mm256_and_si256(_mm256_slli_epi16::<7>(w), mask);
                let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
                let hi = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
                let i = i0 + 2 * p;
                _mm256_storeu_ps(dst.add(i * width), _mm256_mul_ps(lo, two8));
                _mm256_storeu_ps(dst.add((i + 1) * width), _mm256_mul_ps(hi, two8));
            }
        }
    }
    for c in 0..8 {
        for i in full..kc {
            panel[i * width + c] = table[codes[c * ldc + i] as usize];
        }
    }
}
