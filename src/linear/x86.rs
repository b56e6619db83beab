//! x86-64 dot-product kernels of the forward engine (AVX2+FMA, AVX-512).
//!
//! E4M3 rows are decoded in registers with an exact trick: the E4M3 bit
//! pattern shifted into a float16 (`sign << 8 | magnitude << 7`) is the same
//! value times 2^-8, normals and subnormals alike (both formats have a
//! hidden bit; the exponent biases differ by 8), and `vcvtph2ps` widens it
//! exactly. The sum is multiplied by 2^8 at the end (exact). The float16 is
//! built with one sign-extending widen, one shift and one mask. NaN codes are
//! rejected when a layer is built, so they never reach this path.

use std::arch::x86_64::*;
use std::sync::OnceLock;

/// Whether the CPU has F16C (needed by the AVX2 E4M3 dot).
pub fn has_f16c() -> bool {
    static F16C: OnceLock<bool> = OnceLock::new();
    *F16C.get_or_init(|| is_x86_feature_detected!("f16c"))
}

#[target_feature(enable = "avx512f")]
unsafe fn hsum512(v: __m512) -> f32 {
    _mm512_reduce_add_ps(v)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// # Safety
/// AVX-512F required; `a.len() == b.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len() / 32 * 32;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut s0 = _mm512_setzero_ps();
    let mut s1 = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), s0);
        s1 = _mm512_fmadd_ps(
            _mm512_loadu_ps(pa.add(i + 16)),
            _mm512_loadu_ps(pb.add(i + 16)),
            s1,
        );
        i += 32;
    }
    let mut t = hsum512(_mm512_add_ps(s0, s1));
    for j in n..a.len() {
        t = a[j].mul_add(b[j], t);
    }
    t
}

/// # Safety
/// AVX2 and FMA required; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len() / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut s0 = _mm256_setzero_ps();
    let mut s1 = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
        s1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            s1,
        );
        i += 16;
    }
    let mut t = hsum256(_mm256_add_ps(s0, s1));
    for j in n..a.len() {
        t = a[j].mul_add(b[j], t);
    }
    t
}

/// # Safety
/// AVX-512 F+BW required; `codes.len() == x.len()`; no NaN codes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn dot_e4m3_avx512(codes: &[u8], x: &[f32]) -> f32 {
    // Sign-extending the byte to 16 bits and shifting left by 7 puts the
    // magnitude in bits 7..13 and the sign in bits 14 and 15; clearing bit 14
    // leaves the float16 `sign << 15 | magnitude << 7`.
    let mask = _mm512_set1_epi16(0xBF80u16 as i16);
    let n = codes.len() / 32 * 32;
    let (pc, px) = (codes.as_ptr(), x.as_ptr());
    let mut s0 = _mm512_setzero_ps();
    let mut s1 = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let c = _mm512_cvtepi8_epi16(_mm256_loadu_si256(pc.add(i).cast()));
        let h = _mm512_and_si512(_mm512_slli_epi16::<7>(c), mask);
        let w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        let w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h));
        s0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px.add(i)), s0);
        s1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(i + 16)), s1);
        i += 32;
    }
    let t = hsum512(_mm512_add_ps(s0, s1)) * 256.0;
    t + super::kernels::dot_e4m3_scalar(&codes[n..], &x[n..])
}

/// # Safety
/// AVX2, FMA and F16C required; `codes.len() == x.len()`; no NaN codes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_e4m3_avx2(codes: &[u8], x: &[f32]) -> f32 {
    let n = codes.len() / 16 * 16;
    let (pc, px) = (codes.as_ptr(), x.as_ptr());
    let mut s0 = _mm256_setzero_ps();
    let mut s1 = _mm256_setzero_ps();
    let mask = _mm256_set1_epi16(0xBF80u16 as i16);
    let mut i = 0;
    while i < n {
        // See `dot_e4m3_avx512` for the sign-extend-and-shift decode.
        let c = _mm256_cvtepi8_epi16(_mm_loadu_si128(pc.add(i).cast()));
        let h = _mm256_and_si256(_mm256_slli_epi16::<7>(c), mask);
        let w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        let w1 = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
        s0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(px.add(i)), s0);
        s1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(px.add(i + 8)), s1);
        i += 16;
    }
    let t = hsum256(_mm256_add_ps(s0, s1)) * 256.0;
    t + super::kernels::dot_e4m3_scalar(&codes[n..], &x[n..])
}

/// # Safety
/// AVX-512F required; `q.len() == x.len()`.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_i8_avx512(q: &[i8], x: &[f32]) -> f32 {
    let n = q.len() / 16 * 16;
    let (pq, px) = (q.as_ptr(), x.as_ptr());
    let mut s = _mm512_setzero_ps();
    let mut i = 0;
    while i < n {
        let w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(pq.add(i).cast())));
        s = _mm512_fmadd_ps(w, _mm512_loadu_ps(px.add(i)), s);
        i += 16;
    }
    hsum512(s) + super::kernels::dot_i8_scalar(&q[n..], &x[n..])
}

/// # Safety
/// AVX2 and FMA required; `q.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_i8_avx2(q: &[i8], x: &[f32]) -> f32 {
    let n = q.len() / 8 * 8;
    let (pq, px) = (q.as_ptr(), x.as_ptr());
    let mut s = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        let w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(pq.add(i).cast())));
        s = _mm256_fmadd_ps(w, _mm256_loadu_ps(px.add(i)), s);
        i += 8;
    }
    hsum256(s) + super::kernels::dot_i8_scalar(&q[n..], &x[n..])
}

/// `part[i][j] = xs[i] . ws[j]`, 16 zmm accumulators.
///
/// # Safety
/// AVX-512F required; all eight slices have the same length.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot4x4_avx512(xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
    let len = xs[0].len();
    let n = len / 16 * 16;
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i < n {
        let xv: [__m512; 4] = std::array::from_fn(|r| _mm512_loadu_ps(xs[r].as_ptr().add(i)));
        let wv: [__m512; 4] = std::array::from_fn(|c| _mm512_loadu_ps(ws[c].as_ptr().add(i)));
        for r in 0..4 {
            for c in 0..4 {
                acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
            }
        }
        i += 16;
    }
    for r in 0..4 {
        for c in 0..4 {
            let mut t = hsum512(acc[r][c]);
            for j in n..len {
                t = xs[r][j].mul_add(ws[c][j], t);
            }
            part[r][c] = t;
        }
    }
}

/// `part[i][j] = xs[i] . ws[j]`, 16 ymm accumulators.
///
/// # Safety
/// AVX2 and FMA required; all eight slices have the same length.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot4x4_avx2(xs: &[&[f32]; 4], ws: &[&[f32]; 4], part: &mut [[f32; 4]; 4]) {
    let len = xs[0].len();
    let n = len / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i < n {
        let xv: [__m256; 4] = std::array::from_fn(|r| _mm256_loadu_ps(xs[r].as_ptr().add(i)));
        let wv: [__m256; 4] = std::array::from_fn(|c| _mm256_loadu_ps(ws[c].as_ptr().add(i)));
        for r in 0..4 {
            for c in 0..4 {
                acc[r][c] = _mm256_fmadd_ps(xv[r], wv[c], acc[r][c]);
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
