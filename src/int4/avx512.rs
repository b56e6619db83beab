//! AVX-512 (F/BW/VL) kernels of the INT4 matvec and GEMM. Callable only
//! with an [`Avx512`] token, which proves the CPU has the features.
//!
//! Nibble decoding: `vpermps` reads only the low 4 bits of each index, so a
//! permute of a 16-entry table turns a nibble straight into its signed f32
//! value; each byte costs a widening load, a shift, two permutes and two
//! FMAs.

use std::arch::x86_64::*;

use super::format::{dequant_tile_scalar, panel_stride, MatvecArgs, TileArgs, NR};
use super::strips::{matvec_kernels, StripLanes};
use crate::simd::Avx512;

/// Row pairs ahead that the GEMM tile dequantizer prefetches.
const DEQUANT_PREFETCH_PAIRS: usize = 16;

matvec_kernels!("avx512f,avx512bw,avx512vl,avx2,fma", Avx512, __m512);

/// The 16-entry nibble table: lane `i` holds the two's complement value of
/// the nibble `i`, and `vpermps` reads only the low 4 bits of each index, so
/// one permute turns a nibble into its signed f32 (no mask, no conversion).
#[inline(always)]
unsafe fn nibble_table() -> __m512 {
    // SAFETY: the caller guarantees AVX-512 F.
    unsafe {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
        )
    }
}

/// Nibbles through [`nibble_table`], against `x` itself.
impl StripLanes for __m512 {
    fn x<'a>(args: &MatvecArgs<'a>) -> &'a [f32] {
        args.x
    }

    #[inline(always)]
    unsafe fn decode(row: *const u8) -> (Self, Self) {
        // SAFETY: AVX-512 F (the caller), and `row` holds 16 bytes.
        unsafe {
            let table = nibble_table();
            let wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(row as *const __m128i));
            let lo = _mm512_permutexvar_ps(wide, table);
            let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(wide), table);
            (lo, hi)
        }
    }
}

/// AVX-512 GEMM micro-kernel: `out[m][..] = sum_k a[m * lda + k] * b[k * NR ..]`
/// for `M` rows of `a` and one packed panel `b` (`kc` rows of `NR` floats).
/// Not one body with `avx2::gemm_micro`: with 32 registers both panel
/// vectors load first and each row's broadcast follows, while AVX2's 16
/// registers need the broadcasts first (each order spills on the other).
///
/// # Safety
/// The token proves AVX-512 F/BW/VL + FMA; the caller guarantees that `a`
/// holds `M` rows of at least `kc` floats at stride `lda` and `b` holds
/// `kc * NR` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn gemm_micro<const M: usize>(
    _: Avx512,
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    out: &mut [[f32; NR]],
) {
    debug_assert!(b.len() >= kc * NR && out.len() >= M);
    debug_assert!(a.len() >= (M - 1) * lda + kc);
    let mut c0 = [_mm512_setzero_ps(); M];
    let mut c1 = [_mm512_setzero_ps(); M];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for k in 0..kc {
        // SAFETY: k < kc, so b[k*NR .. k*NR + 32] and a[m*lda + k] are in
        // bounds per the function's contract.
        unsafe {
            let b0 = _mm512_loadu_ps(bp.add(k * NR));
            let b1 = _mm512_loadu_ps(bp.add(k * NR + 16));
            for m in 0..M {
                let av = _mm512_set1_ps(*ap.add(m * lda + k));
                c0[m] = _mm512_fmadd_ps(av, b0, c0[m]);
                c1[m] = _mm512_fmadd_ps(av, b1, c1[m]);
            }
        }
    }
    for m in 0..M {
        // SAFETY: out[m] is an array of NR = 32 floats.
        unsafe {
            _mm512_storeu_ps(out[m].as_mut_ptr(), c0[m]);
            _mm512_storeu_ps(out[m].as_mut_ptr().add(16), c1[m]);
        }
    }
}

/// Tile dequantizer, the same output as `format::dequant_tile_scalar`:
/// per row pair and full 32-column panel, two 16-byte loads become four
/// vectors of f32 codes through the `vpermps` nibble table, times the scales.
/// Partial panels (the last columns) use the generic code.
///
/// # Safety
/// None beyond the token: it proves AVX-512 F/BW/VL + FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn dequant_tile(_: Avx512, t: &TileArgs, packed: &mut [f32]) {
    let n = t.out_feat;
    let gs = t.group_size;
    let full_panels = t.nc / NR;
    // SAFETY: the token proves AVX-512 F.
    let table = unsafe { nibble_table() };
    debug_assert!(t.k0.is_multiple_of(2) && packed.len() >= t.nc.div_ceil(NR) * panel_stride(t.kc));
    for rr in (0..t.kc).step_by(2) {
        let r = t.k0 + rr;
        let both = rr + 1 < t.kc;
        let g = r / gs;
        // The tile's rows are `out_feat` bytes apart, a pattern the hardware
        // prefetchers barely follow: fetch a few row pairs ahead by hand
        // (prefetches never fault, so running past the end is harmless).
        let ahead = t
            .data
            .as_ptr()
            .wrapping_add((r / 2 + DEQUANT_PREFETCH_PAIRS) * n + t.c0);
        for line in (0..t.nc).step_by(64) {
            // A prefetch is only a hint: it never dereferences or faults.
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
        }
        for j in 0..full_panels {
            let cj = t.c0 + j * NR;
            let src = &t.data[(r / 2) * n + cj..(r / 2) * n + cj + NR];
            let sc = &t.scales[g * n + cj..g * n + cj + NR];
            let dst = &mut packed[j * panel_stride(t.kc) + rr * NR..];
            debug_assert!(dst.len() >= if both { 2 * NR } else { NR });
            for h in 0..2 {
                // SAFETY: src and sc hold NR = 32 elements, so offsets 16 h
                // .. 16 h + 16 are in bounds; dst holds NR floats for row rr
                // (and NR more for row rr + 1 when `both`), asserted above.
                unsafe {
                    let bytes = _mm_loadu_si128(src.as_ptr().add(16 * h) as *const __m128i);
                    let wide = _mm512_cvtepu8_epi32(bytes);
                    let s = _mm512_loadu_ps(sc.as_ptr().add(16 * h));
                    let lo = _mm512_mul_ps(_mm512_permutexvar_ps(wide, table), s);
                    _mm512_storeu_ps(dst.as_mut_ptr().add(16 * h), lo);
                    if both {
                        let hi_idx = _mm512_srli_epi32::<4>(wide);
                        let hi = _mm512_mul_ps(_mm512_permutexvar_ps(hi_idx, table), s);
                        _mm512_storeu_ps(dst.as_mut_ptr().add(NR + 16 * h), hi);
                    }
                }
            }
        }
    }
    if full_panels * NR < t.nc {
        let rest = t.columns_from(full_panels * NR);
        let off = full_panels * panel_stride(t.kc);
        dequant_tile_scalar(&rest, &mut packed[off..]);
    }
}
