//! x86-64 kernels (AVX2+FMA and AVX-512) for INT4 matvec and the GEMM
//! micro-kernel. Callers guarantee the CPU features (see `simd::level`).
//!
//! Nibble decoding (matvec). AVX-512: `vpermps` reads only the low 4 bits of
//! each index, so a permute of a 16-entry table turns a nibble straight into
//! its signed f32 value; each byte costs a widening load, a shift, two
//! permutes and two FMAs. AVX2 (8-entry permutes only): a byte sign-extended
//! to i32 is `hi * 16 + lo_unsigned`; `(v << 28)` is `lo * 2^28` and
//! `(v & !15)` is `hi * 16`, both exact in f32, so with `x` pre-scaled by
//! 2^-28 and 1/16 (exact powers of two) a byte costs a widening load, a shift,
//! an and, two conversions and two FMAs.

use std::arch::x86_64::*;

use super::gemm::{panel_stride, NR};
use super::matvec::{scalar_group, MatvecArgs};

/// Columns per register-blocked strip: 8 accumulators.
const STRIP_VECS: usize = 8;
/// Bytes ahead (along a row) that the matvec strips prefetch.
const PREFETCH_AHEAD: usize = 512;
/// Bytes ahead (along a scale row) that the matvec strips prefetch: the
/// scales are a fifth of the bytes a matvec reads, and a strip otherwise
/// meets them cold in its epilogue (measured: 5-8% of the call).
const SCALE_PREFETCH_AHEAD: usize = 2048;
/// Row pairs ahead that the GEMM tile dequantizer prefetches.
const DEQUANT_PREFETCH_PAIRS: usize = 16;

/// AVX-512 matvec over the columns `o0 .. o0 + y.len()`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2 and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn matvec_int4_avx512(args: &MatvecArgs, o0: usize, y: &mut [f32]) {
    y.fill(0.0);
    let width = y.len();
    let mut acc_tail = [0.0f32; 16];
    let wrap = Ahead::wrap(args, width);
    for g in args.groups.clone() {
        let mut o = 0;
        while o + 16 * STRIP_VECS <= width {
            let ahead = wrap.at(o, width);
            let ys = &mut y[o..o + 16 * STRIP_VECS];
            strip_avx512::<STRIP_VECS>(args, g, o0 + o, ys, ahead);
            o += 16 * STRIP_VECS;
        }
        while o + 16 <= width {
            strip_avx512::<1>(args, g, o0 + o, &mut y[o..o + 16], Ahead::default());
            o += 16;
        }
        if o < width {
            let n = width - o;
            scalar_group(args, g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
        }
    }
}

/// Byte offsets added to a strip's prefetch addresses: zero along the
/// current group; near the end of the task's columns, where the prefetch
/// distance runs past them, the jump to the same distance into the next
/// group's rows and scale row, so that each group starts with its first
/// strips already on the way.
#[derive(Clone, Copy, Default)]
pub(super) struct Ahead {
    rows: isize,
    scales: isize,
}

impl Ahead {
    /// The jumps for a task `width` columns wide (row pitch `n` bytes,
    /// scale pitch `4n`).
    pub(super) fn wrap(args: &MatvecArgs, width: usize) -> Ahead {
        let n = args.out_feat;
        Ahead {
            rows: (args.group_size / 2 * n) as isize - width as isize,
            scales: 4 * (n as isize - width as isize),
        }
    }

    /// The offsets for the strip starting at column `o` of the task.
    pub(super) fn at(self, o: usize, width: usize) -> Ahead {
        Ahead {
            rows: if o + PREFETCH_AHEAD >= width {
                self.rows
            } else {
                0
            },
            scales: if 4 * o + SCALE_PREFETCH_AHEAD >= 4 * width {
                self.scales
            } else {
                0
            },
        }
    }

    /// Prefetch the `lines` cache lines from `SCALE_PREFETCH_AHEAD` bytes
    /// past the scales of group `g` at column `c0`.
    #[inline(always)]
    pub(super) fn prefetch_scales(self, args: &MatvecArgs, g: usize, c0: usize, lines: usize) {
        let at = (args.scales.as_ptr().wrapping_add(g * args.out_feat + c0) as *const u8)
            .wrapping_add(SCALE_PREFETCH_AHEAD)
            .wrapping_offset(self.scales);
        for line in 0..lines {
            // SAFETY: a prefetch never faults, whatever the address; SSE is
            // part of x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line) as *const i8) };
        }
    }

    /// Prefetch `lines` cache lines `PREFETCH_AHEAD` bytes along `row`,
    /// into L2 (T1): measured 10-15% faster from DRAM than into L1 (T0) or
    /// L3 (T2) on Zen 4, at group size 32 and 128 alike.
    #[inline(always)]
    pub(super) fn prefetch_row(self, row: *const u8, lines: usize) {
        let at = row.wrapping_add(PREFETCH_AHEAD).wrapping_offset(self.rows);
        for line in 0..lines {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(64 * line) as *const i8) };
        }
    }
}

/// One group's contribution to `V * 16` columns starting at `c0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn strip_avx512<const V: usize>(
    args: &MatvecArgs,
    g: usize,
    c0: usize,
    y: &mut [f32],
    ahead: Ahead,
) {
    debug_assert_eq!(y.len(), 16 * V);
    let half = args.group_size / 2;
    let n = args.out_feat;
    // vpermps reads only the low 4 bits of each index lane, so one
    // permute turns a nibble into its signed value as f32 (no mask, no
    // conversion): lane i of the table holds the two's complement value of i.
    let table = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
    );
    let mut acc = [_mm512_setzero_ps(); V];
    let p_end = (g + 1) * half;
    debug_assert!(p_end * n <= args.data.len() && c0 + 16 * V <= n);
    ahead.prefetch_scales(args, g, c0, (64 * V).div_ceil(64));
    for p in g * half..p_end {
        // SAFETY: p < num_pairs and c0 + 16 V <= out_feat (asserted above by
        // construction of the strips), so the row slice is inside `data`;
        // 2p + 1 < in_padded = x.len().
        unsafe {
            let row = args.data.as_ptr().add(p * n + c0);
            // The strips of a group walk its rows side by side, which the
            // hardware prefetchers follow poorly: fetch this row's bytes a
            // few strips ahead (a prefetch never faults, even past the end).
            ahead.prefetch_row(row, (16 * V).div_ceil(64));
            let x0 = _mm512_set1_ps(*args.x.get_unchecked(2 * p));
            let x1 = _mm512_set1_ps(*args.x.get_unchecked(2 * p + 1));
            for (v, a) in acc.iter_mut().enumerate() {
                let bytes = _mm_loadu_si128(row.add(16 * v) as *const __m128i);
                let wide = _mm512_cvtepu8_epi32(bytes);
                let lo = _mm512_permutexvar_ps(wide, table);
                let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(wide), table);
                *a = _mm512_fmadd_ps(lo, x0, *a);
                *a = _mm512_fmadd_ps(hi, x1, *a);
            }
        }
    }
    let srow = &args.scales[g * n + c0..g * n + c0 + 16 * V];
    for (v, a) in acc.iter().enumerate() {
        // SAFETY: y and srow hold 16 V floats; unaligned loads and stores.
        unsafe {
            let yp = y.as_mut_ptr().add(16 * v);
            let s = _mm512_loadu_ps(srow.as_ptr().add(16 * v));
            _mm512_storeu_ps(yp, _mm512_fmadd_ps(*a, s, _mm512_loadu_ps(yp)));
        }
    }
}

/// AVX2+FMA matvec over the columns `o0 .. o0 + y.len()`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn matvec_int4_avx2(args: &MatvecArgs, o0: usize, y: &mut [f32]) {
    y.fill(0.0);
    let width = y.len();
    let mut acc_tail = [0.0f32; 8];
    let wrap = Ahead::wrap(args, width);
    for g in args.groups.clone() {
        let mut o = 0;
        while o + 8 * STRIP_VECS <= width {
            let ahead = wrap.at(o, width);
            strip_avx2::<STRIP_VECS>(args, g, o0 + o, &mut y[o..o + 8 * STRIP_VECS], ahead);
            o += 8 * STRIP_VECS;
        }
        while o + 8 <= width {
            strip_avx2::<1>(args, g, o0 + o, &mut y[o..o + 8], Ahead::default());
            o += 8;
        }
        if o < width {
            let n = width - o;
            scalar_group(args, g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn strip_avx2<const V: usize>(
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
    debug_assert!(p_end * n <= args.data.len() && c0 + 8 * V <= n);
    ahead.prefetch_scales(args, g, c0, (32 * V).div_ceil(64));
    for p in g * half..p_end {
        // SAFETY: as in `strip_avx512`: the row slice and xs indices are in
        // bounds by construction; `_mm_loadl_epi64` reads 8 bytes.
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

/// AVX-512 GEMM micro-kernel: `out[m][..] = sum_k a[m * lda + k] * b[k * NR ..]`
/// for `M` rows of `a` and one packed panel `b` (`kc` rows of `NR` floats).
///
/// # Safety
/// AVX-512 F/BW/VL + FMA; `a` holds `M` rows of at least `kc` floats at
/// stride `lda`; `b` holds `kc * NR` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn gemm_micro_avx512<const M: usize>(
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

/// AVX2+FMA GEMM micro-kernel, same contract as [`gemm_micro_avx512`].
///
/// # Safety
/// AVX2 + FMA, and the bounds of [`gemm_micro_avx512`].
#[target_feature(enable = "avx2,fma")]
pub unsafe fn gemm_micro_avx2<const M: usize>(
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
        // SAFETY: as in `gemm_micro_avx512`.
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

/// AVX-512 tile dequantizer, same output as `gemm::dequant_tile_generic`:
/// per row pair and full 32-column panel, two 16-byte loads become four
/// vectors of f32 codes through the `vpermps` nibble table, times the scales.
/// Partial panels (the last columns) use the generic code.
///
/// # Safety
/// AVX-512 F/BW/VL + FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub unsafe fn dequant_tile_avx512(t: &super::gemm::TileArgs, packed: &mut [f32]) {
    let qw = t.qw;
    let n = qw.out_feat;
    let gs = qw.group_size();
    let full_panels = t.nc / NR;
    let table = _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
    );
    debug_assert!(t.k0.is_multiple_of(2) && packed.len() >= t.nc.div_ceil(NR) * panel_stride(t.kc));
    for rr in (0..t.kc).step_by(2) {
        let r = t.k0 + rr;
        let both = rr + 1 < t.kc;
        let g = r / gs;
        // The tile's rows are `out_feat` bytes apart, a pattern the hardware
        // prefetchers barely follow: fetch a few row pairs ahead by hand
        // (prefetches never fault, so running past the end is harmless).
        let ahead = qw
            .data
            .as_ptr()
            .wrapping_add((r / 2 + DEQUANT_PREFETCH_PAIRS) * n + t.c0);
        for line in (0..t.nc).step_by(64) {
            // A prefetch is only a hint: it never dereferences or faults.
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
        }
        for j in 0..full_panels {
            let cj = t.c0 + j * NR;
            let src = &qw.data[(r / 2) * n + cj..(r / 2) * n + cj + NR];
            let sc = &qw.scales[g * n + cj..g * n + cj + NR];
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
        let rest = super::gemm::TileArgs {
            qw,
            k0: t.k0,
            kc: t.kc,
            c0: t.c0 + full_panels * NR,
            nc: t.nc - full_panels * NR,
        };
        let off = full_panels * panel_stride(t.kc);
        super::gemm::dequant_tile_generic(&rest, &mut packed[off..]);
    }
}

/// The tile dequantizer compiled with AVX2 enabled.
///
/// # Safety
/// AVX2 + FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dequant_tile_avx2(t: &super::gemm::TileArgs, packed: &mut [f32]) {
    super::gemm::dequant_tile_generic(t, packed)
}
