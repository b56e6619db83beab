//! AVX2 + FMA kernels of the INT4 matvec and GEMM. Callable only with an
//! [`Avx2`] token, which proves the CPU has the features.
//!
//! Nibble decoding (8-lane permutes only): a byte sign-extended to i32 is
//! `hi * 16 + lo_unsigned`; `(v << 28)` is `lo * 2^28` and `(v & !15)` is
//! `hi * 16`, both exact in f32, so with `x` pre-scaled by 2^-28 and 1/16
//! (exact powers of two, `MatvecArgs::xs`) a byte costs a widening load, a
//! shift, an and, two conversions and two FMAs.

use std::arch::x86_64::*;

use super::format::{dequant_tile_scalar, MatvecArgs, TileArgs, NR};
use super::strips::{walk, Ahead, STRIP_VECS};
use crate::simd::Avx2;

/// Matvec over the columns `o0 .. o0 + y.len()`; `args.xs` must be filled.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matvec(_: Avx2, args: &MatvecArgs, o0: usize, y: &mut [f32]) {
    walk(args, o0, y, 8, |g, c0, ys, ahead, wide| {
        // SAFETY: this function's features are present (the token); the
        // walk hands out strips inside the matrix.
        unsafe {
            if wide {
                strip::<STRIP_VECS>(args, g, c0, ys, ahead)
            } else {
                strip::<1>(args, g, c0, ys, ahead)
            }
        }
    });
}

/// One group's contribution to `V * 8` columns starting at `c0`.
#[target_feature(enable = "avx2,fma")]
unsafe fn strip<const V: usize>(
    args: &MatvecArgs,
    g: usize,
    c0: usize,
    y: &mut [f32],
    ahead: Ahead,
) {
    debug_assert_eq!(y.len(), 8 * V);
    let half = args.group_size / 2;
    let n = args.out_feat;
    let mask_hi = _mm256_set1_epi32(!0xF);
    let mut acc = [_mm256_setzero_ps(); V];
    let p_end = (g + 1) * half;
    assert!(p_end * n <= args.data.len() && c0 + 8 * V <= n && 2 * p_end <= args.xs.len());
    ahead.prefetch_scales(args, g, c0, (32 * V).div_ceil(64));
    for p in g * half..p_end {
        // SAFETY: the row slice and xs indices are in bounds (asserted
        // above); `_mm_loadl_epi64` reads 8 bytes.
        unsafe {
            let row = args.data.as_ptr().add(p * n + c0);
            ahead.prefetch_row(row, (8 * V).div_ceil(64));
            let x0 = _mm256_set1_ps(*args.xs.get_unchecked(2 * p));
            let x1 = _mm256_set1_ps(*args.xs.get_unchecked(2 * p + 1));
            for (v, a) in acc.iter_mut().enumerate() {
                let bytes = _mm_loadl_epi64(row.add(8 * v) as *const __m128i);
                let wide = _mm256_cvtepi8_epi32(bytes);
                let lo = _mm256_cvtepi32_ps(_mm256_slli_epi32::<28>(wide));
                let hi = _mm256_cvtepi32_ps(_mm256_and_si256(wide, mask_hi));
                *a = _mm256_fmadd_ps(lo, x0, *a);
                *a = _mm256_fmadd_ps(hi, x1, *a);
            }
        }
    }
    let srow = &args.scales[g * n + c0..g * n + c0 + 8 * V];
    for (v, a) in acc.iter().enumerate() {
        // SAFETY: y and srow hold 8 V floats; unaligned loads and stores.
        unsafe {
            let yp = y.as_mut_ptr().add(8 * v);
            let s = _mm256_loadu_ps(srow.as_ptr().add(8 * v));
            _mm256_storeu_ps(yp, _mm256_fmadd_ps(*a, s, _mm256_loadu_ps(yp)));
        }
    }
}

/// GEMM micro-kernel: `out[m][..] = sum_k a[m * lda + k] * b[k * NR ..]`
/// for `M` rows of `a` and one packed panel `b` (`kc` rows of `NR` floats).
///
/// # Safety
/// The token proves AVX2 + FMA; the caller guarantees that `a` holds `M`
/// rows of at least `kc` floats at stride `lda` and `b` holds `kc * NR`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_micro<const M: usize>(
    _: Avx2,
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    out: &mut [[f32; NR]],
) {
    debug_assert!(b.len() >= kc * NR && out.len() >= M);
    debug_assert!(a.len() >= (M - 1) * lda + kc);
    let mut c = [[_mm256_setzero_ps(); 4]; M];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for k in 0..kc {
        // SAFETY: k < kc, so b[k*NR .. k*NR + 32] and a[m*lda + k] are in
        // bounds per the function's contract.
        unsafe {
            let bk = bp.add(k * NR);
            let bv = [
                _mm256_loadu_ps(bk),
                _mm256_loadu_ps(bk.add(8)),
                _mm256_loadu_ps(bk.add(16)),
                _mm256_loadu_ps(bk.add(24)),
            ];
            for (m, cm) in c.iter_mut().enumerate() {
                let av = _mm256_set1_ps(*ap.add(m * lda + k));
                for (cv, bvv) in cm.iter_mut().zip(bv.iter()) {
                    *cv = _mm256_fmadd_ps(av, *bvv, *cv);
                }
            }
        }
    }
    for (m, cm) in c.iter().enumerate() {
        for (j, cv) in cm.iter().enumerate() {
            // SAFETY: out[m] holds 32 floats; j * 8 + 8 <= 32.
            unsafe { _mm256_storeu_ps(out[m].as_mut_ptr().add(8 * j), *cv) };
        }
    }
}

/// The scalar tile dequantizer compiled with AVX2 enabled.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dequant_tile(_: Avx2, t: &TileArgs, packed: &mut [f32]) {
    dequant_tile_scalar(t, packed)
}
