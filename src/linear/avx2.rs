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
