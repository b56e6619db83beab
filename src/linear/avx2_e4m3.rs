//! The AVX2 + FMA body of the batch-1 E4M3 row kernel (`e4m3_rows.rs`
//! describes the decode and its conditions): four output rows per pass
//! over `x`, each code widened to a 32-bit lane and turned into the float32
//! `E4M3 * 2^-120` by one shift and one mask, with no `vcvtph2ps`.
//!
//! Why not the float16 decode of `avx2::dot_e4m3`: on Zen 3 its two
//! `vcvtph2ps` per 16 codes bound the loop (10-11 GB/s of codes on one
//! core in cache); the shift-and-mask decode runs on the integer ports
//! beside the FMAs (docs/benchmarks.md, "What bounds the batch-1 FP8
//! forward").

use std::arch::x86_64::*;

use super::e4m3_rows::{e4m3_bits_scalar, UNSCALE};
use crate::simd::{Avx2, F32Lanes};

/// Bits kept of `sext(code) << 20`: the sign and the 7 magnitude bits,
/// clearing the copies of the sign that the shift leaves in bits 27-30.
const KEEP: i32 = 0x87FF_FFFFu32 as i32;
/// Codes per loop step of the 4-row body.
const STEP4: usize = 16;
/// Codes per loop step of the 1-row body.
const STEP1: usize = 32;
/// How far ahead the one-row body prefetches its codes (see `avx512.rs`).
const PREFETCH: usize = 2048;
/// How far ahead the 4-row body prefetches each row's codes: with four
/// streams 2 KiB (and 512 B) ahead it read 45 MB from DRAM about 10 %
/// slower than the one-row float16 dot on Zen 3, 4 KiB (or none) as fast
/// (one thread, thread CPU time, alternated).
const PREFETCH4: usize = 4096;

/// Eight codes at `p` as the float32 `E4M3 * 2^-120` (see `e4m3_rows.rs`).
///
/// # Safety
/// AVX2, and 8 readable bytes at `p`.
#[inline(always)]
unsafe fn decode8(p: *const u8, keep: __m256i) -> __m256 {
    // SAFETY: the caller guarantees AVX2 and the 8 bytes.
    unsafe {
        let c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32::<20>(c), keep))
    }
}

/// `out[i]` = (E4M3 row `i` of `codes` (rows of `k` codes)) `. xs * 2^8`,
/// for `xs` = `x * 2^112` (`e4m3_rows::prescaled`), so each is the row's
/// dot with `x`.
///
/// # Safety
/// None beyond the token (AVX2 and FMA). The result is meaningful only
/// with DAZ clear on this thread (the caller, `Dots::e4m3_rows`, checks).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_e4m3_rows(_: Avx2, codes: &[u8], k: usize, xs: &[f32], out: &mut [f32]) {
    assert!(xs.len() == k && codes.len() >= out.len() * k);
    let mut r = 0;
    while r + 4 <= out.len() {
        // SAFETY: rows r .. r + 4 lie in `codes` (asserted above).
        unsafe { rows4(&codes[r * k..(r + 4) * k], k, xs, &mut out[r..r + 4]) };
        r += 4;
    }
    for (i, o) in out.iter_mut().enumerate().skip(r) {
        // SAFETY: row i lies in `codes` (asserted above).
        *o = unsafe { row1(&codes[i * k..(i + 1) * k], xs) };
    }
}

/// Four rows: `x` loaded once per step for all four, two accumulators per
/// row (eight FMA chains, the FMA latency times its throughput).
///
/// # Safety
/// AVX2 and FMA; `codes.len() == 4 * k`, `xs.len() == k`, `out.len() == 4`.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows4(codes: &[u8], k: usize, xs: &[f32], out: &mut [f32]) {
    let n = k / STEP4 * STEP4;
    let px = xs.as_ptr();
    let pc: [*const u8; 4] = std::array::from_fn(|r| codes[r * k..].as_ptr());
    let keep = _mm256_set1_epi32(KEEP);
    let mut s = [[_mm256_setzero_ps(); 2]; 4];
    let mut i = 0;
    while i < n {
        if i % 64 == 0 {
            for p in pc {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + PREFETCH4).cast());
            }
        }
        // SAFETY: i + 16 <= n <= k: every load reads inside row r's k codes
        // and inside `xs`.
        unsafe {
            let x0 = _mm256_loadu_ps(px.add(i));
            let x1 = _mm256_loadu_ps(px.add(i + 8));
            for (acc, p) in s.iter_mut().zip(pc) {
                acc[0] = _mm256_fmadd_ps(decode8(p.add(i), keep), x0, acc[0]);
                acc[1] = _mm256_fmadd_ps(decode8(p.add(i + 8), keep), x1, acc[1]);
            }
        }
        i += STEP4;
    }
    for (r, (o, acc)) in out.iter_mut().zip(s).enumerate() {
        // SAFETY: this function's features include AVX2.
        let mut t = unsafe { _mm256_add_ps(acc[0], acc[1]).hsum() };
        for j in n..k {
            t = e4m3_bits_scalar(codes[r * k + j]).mul_add(xs[j], t);
        }
        *o = t * UNSCALE;
    }
}

/// One row: four accumulators over 32 codes a step.
///
/// # Safety
/// AVX2 and FMA; `codes.len() == xs.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn row1(codes: &[u8], xs: &[f32]) -> f32 {
    let k = codes.len();
    let n = k / STEP1 * STEP1;
    let (pc, px) = (codes.as_ptr(), xs.as_ptr());
    let keep = _mm256_set1_epi32(KEEP);
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < n {
        if i % 64 == 0 {
            _mm_prefetch::<_MM_HINT_T0>(pc.wrapping_add(i + PREFETCH).cast());
        }
        for (q, acc) in s.iter_mut().enumerate() {
            let j = i + 8 * q;
            // SAFETY: j + 8 <= n <= k = codes.len() = xs.len().
            unsafe {
                *acc = _mm256_fmadd_ps(decode8(pc.add(j), keep), _mm256_loadu_ps(px.add(j)), *acc)
            };
        }
        i += STEP1;
    }
    let v = _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3]));
    // SAFETY: this function's features include AVX2.
    let mut t = unsafe { v.hsum() };
    for j in n..k {
        t = e4m3_bits_scalar(codes[j]).mul_add(xs[j], t);
    }
    t * UNSCALE
}
