//! AVX-512 dot-product kernels of the linear layers' forward engine,
//! callable only with an [`Avx512`] token. The f32 and int8 dots are the
//! bodies of `dots.rs` over `__m512`.
//!
//! E4M3 rows are decoded in registers with an exact trick: the E4M3 bit
//! pattern shifted into a float16 (`sign << 8 | magnitude << 7`) is the same
//! value times 2^-8, normals and subnormals alike (both formats have a
//! hidden bit; the exponent biases differ by 8), and `vcvtph2ps` widens it
//! exactly. The sum is multiplied by 2^8 at the end (exact). The float16 is
//! built with one sign-extending widen, one shift and one mask. NaN codes are
//! rejected when a layer is built, so they never reach this path.

use std::arch::x86_64::*;

use super::dots;
use super::format::dot_e4m3_scalar;
use crate::simd::Avx512;

/// # Safety
/// None beyond the token: it proves AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_f32(_: Avx512, a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the token proves the features of `__m512`'s lanes.
    unsafe { dots::dot_f32::<__m512>(a, b) }
}

/// Its own body, not `dots.rs`'s: see `avx2::dot_e4m3`.
///
/// # Safety
/// None beyond the token: it proves AVX-512 F/BW/VL. NaN codes give a meaningless sum (layers reject them).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn dot_e4m3(_: Avx512, codes: &[u8], x: &[f32]) -> f32 {
    assert_eq!(codes.len(), x.len());
    // Sign-extending the byte to 16 bits and shifting left by 7 puts the
    // magnitude in bits 7..13 and the sign in bits 14 and 15; clearing bit 14
    // leaves the float16 `sign << 15 | magnitude << 7`.
    let mask = _mm512_set1_epi16(0xBF80u16 as i16);
    let (pc, px) = (codes.as_ptr(), x.as_ptr());
    // 32 codes -> two f32 vectors, scaled by 2^-8.
    let widen = |i: usize| {
        // SAFETY: callers pass i + 32 <= codes.len() == x.len().
        let c = unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(pc.add(i).cast())) };
        let h = _mm512_and_si512(_mm512_slli_epi16::<7>(c), mask);
        (
            _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)),
        )
    };
    // Four independent sums (as the AVX2 kernel), 64 codes per iteration.
    let mut s = [_mm512_setzero_ps(); 4];
    let n64 = codes.len() / 64 * 64;
    let mut i = 0;
    while i < n64 {
        // Codes 2 KiB ahead (past this row: the next one, which the same
        // task reads next); a prefetch never faults. Without it one core
        // streamed ~6.5 GB/s of codes from DRAM against ~12 GB/s in cache
        // (docs/benchmarks.md, "FP8 batch 1").
        _mm_prefetch::<_MM_HINT_T0>(pc.wrapping_add(i + 2048).cast());
        let (w0, w1) = widen(i);
        let (w2, w3) = widen(i + 32);
        // SAFETY: i + 64 <= n64 <= codes.len() == x.len().
        unsafe {
            s[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px.add(i)), s[0]);
            s[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(i + 16)), s[1]);
            s[2] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(px.add(i + 32)), s[2]);
            s[3] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(px.add(i + 48)), s[3]);
        }
        i += 64;
    }
    let n = codes.len() / 32 * 32;
    if i < n {
        let (w0, w1) = widen(i);
        // SAFETY: i + 32 <= n <= codes.len() == x.len().
        unsafe {
            s[0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px.add(i)), s[0]);
            s[1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(i + 16)), s[1]);
        }
    }
    let t = _mm512_reduce_add_ps(_mm512_add_ps(
        _mm512_add_ps(s[0], s[1]),
        _mm512_add_ps(s[2], s[3]),
    )) * 256.0;
    t + dot_e4m3_scalar(&codes[n..], &x[n..])
}

/// # Safety
/// None beyond the token: it proves AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot_i8(_: Avx512, q: &[i8], x: &[f32]) -> f32 {
    // SAFETY: the token proves the features of `__m512`'s lanes.
    unsafe { dots::dot_i8::<__m512>(q, x) }
}

/// `part[i][j] = xs[i] . ws[j]`, 16 zmm accumulators.
///
/// # Safety
/// None beyond the token: it proves AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot4x4(
    _: Avx512,
    xs: &[&[f32]; 4],
    ws: &[&[f32]; 4],
    part: &mut [[f32; 4]; 4],
) {
    // SAFETY: the token proves the features of `__m512`'s lanes.
    unsafe { dots::dot4x4::<__m512>(xs, ws, part) }
}
