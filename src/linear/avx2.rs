//! AVX2 + FMA dot-product kernels of the linear layers' forward engine,
//! callable only with an [`Avx2`] token (the E4M3 dot with [`Avx2F16c`];
//! its decode is described in `avx512.rs`).

use std::arch::x86_64::*;

use super::format::{dot_e4m3_scalar, dot_i8_scalar};
use crate::simd::{Avx2, Avx2F16c};

#[target_feature(enable = "avx2,fma")]
fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_f32(_: Avx2, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let n = a.len() / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut s0 = _mm256_setzero_ps();
    let mut s1 = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: i + 16 <= n <= a.len() == b.len().
        unsafe {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                s1,
            );
        }
        i += 16;
    }
    let mut t = hsum256(_mm256_add_ps(s0, s1));
    for j in n..a.len() {
        t = a[j].mul_add(b[j], t);
    }
    t
}

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
    let t = hsum256(_mm256_add_ps(
        _mm256_add_ps(s[0], s[1]),
        _mm256_add_ps(s[2], s[3]),
    )) * 256.0;
    t + dot_e4m3_scalar(&codes[n..], &x[n..])
}

/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot_i8(_: Avx2, q: &[i8], x: &[f32]) -> f32 {
    assert_eq!(q.len(), x.len());
    let n = q.len() / 8 * 8;
    let (pq, px) = (q.as_ptr(), x.as_ptr());
    let mut s = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n <= q.len() == x.len().
        unsafe {
            let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(pq.add(i).cast())));
            s = _mm256_fmadd_ps(w, _mm256_loadu_ps(px.add(i)), s);
        }
        i += 8;
    }
    hsum256(s) + dot_i8_scalar(&q[n..], &x[n..])
}

/// `part[i][j] = xs[i] . ws[j]`, 16 ymm accumulators.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot4x4(_: Avx2, xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
    assert!(xs.iter().chain(ws).all(|s| s.len() == xs[0].len()));
    let len = xs[0].len();
    let n = len / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 <= n <= len, the length of all eight slices (asserted).
        unsafe {
            let xv: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(xs[r].as_ptr().add(i)));
            let wv: [__m256; 4] = std::array::from_fn(|c| _mm256_loadu_ps(ws[c].as_ptr().add(i)));
            for r in 0..4 {
                for c in 0..4 {
                    acc[r][c] = _mm256_fmadd_ps(xv[r], wv[c], acc[r][c]);
                }
            }
        }
        i += 8;
    }
    for r in 0..4 {
        for c in 0..4 {
            let mut t = hsum256(acc[r][c]);
            for j in n..len {
                t = xs[r][j].mul_add(ws[c][j], t);
            }
            part[r][c] = t;
        }
    }
}
