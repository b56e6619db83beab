//! AVX2 + FMA kernels of the INT4 matvec and GEMM. Callable only with an
//! [`Avx2`] token, which proves the CPU has the features.
//!
//! Nibble decoding (8-lane permutes only): a byte sign-extended to i32 is
//! `hi * 16 + lo_unsigned`; `(v << 28)` is `lo * 2^28` and `(v & !15)` is
//! `hi * 16`, both exact in f32, so with `x` pre-scaled by 2^-28 and 1/16
//! (exact powers of two, `MatvecArgs::xs`) a byte costs a widening load, a
//! shift, an and, two conversions and two FMAs. The single-row strip is the
//! generic body of `strips.rs` over `__m256`; the multi-row strip and the
//! GEMM micro-kernel are AVX2's own (see each).

use std::arch::x86_64::*;

use super::format::{
    dequant_tile_scalar, panel_stride, scalar_group, MatvecArgs, RowsArgs, TileArgs, NR,
};
use super::strips::{matvec_kernels, Ahead, StripLanes};
use crate::simd::Avx2;

matvec_kernels!("avx2,fma", Avx2, __m256, slabs);

/// A byte sign-extended to i32 is `hi * 16 + lo_unsigned`: `(v << 28)` is
/// `lo * 2^28` and `(v & !15)` is `hi * 16`, both exact in f32, against
/// `xs`, which holds `x` pre-scaled by 2^-28 and 1/16.
impl StripLanes for __m256 {
    fn x<'a>(args: &MatvecArgs<'a>) -> &'a [f32] {
        args.xs
    }

    #[inline(always)]
    unsafe fn decode(row: *const u8) -> (Self, Self) {
        // SAFETY: AVX2 (the caller), and `row` holds 8 bytes, which
        // `_mm_loadl_epi64` reads.
        unsafe {
            let wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(row as *const __m128i));
            let lo = _mm256_cvtepi32_ps(_mm256_slli_epi32::<28>(wide));
            let hi = _mm256_cvtepi32_ps(_mm256_and_si256(wide, _mm256_set1_epi32(!0xF)));
            (lo, hi)
        }
    }
}

/// Rows of `x` one pass of the multi-row kernel serves: 4 rows x 2 vectors
/// are 8 accumulators, with the decoded nibbles, two broadcasts and the
/// mask 15 of the 16 registers.
const ROWS_PER_PASS: usize = 4;
/// Vectors (of 8 columns) per multi-row strip.
const ROW_VECS: usize = 2;

/// Matvec of every row of `args` over the columns `o0 .. o0 + width`
/// (`ys[r]` is row `r`'s output, `width` floats). Per group and strip of 16
/// columns the strip's packed bytes (8 per pair of rows) are decoded once
/// per pass of up to four rows of `x` and feed all of them; the passes over
/// one strip follow each other, so the bytes come from memory once and from
/// L1 after. Each row's sums are formed in the single-row kernel's order
/// (per group: the pairs' two FMAs in turn, then one FMA with the scale), so
/// a row's result equals [`matvec`]'s on the same columns and groups.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matvec_rows(_: Avx2, args: &RowsArgs, o0: usize, ys: &mut [&mut [f32]]) {
    let base = &args.base;
    let width = ys.first().map_or(0, |y| y.len());
    assert!(ys.len() == args.rows && ys.iter().all(|y| y.len() == width));
    assert!(args.base.xs.len() >= args.rows * args.pitch);
    for y in ys.iter_mut() {
        y.fill(0.0);
    }
    let passes = args.rows.div_ceil(ROWS_PER_PASS);
    // Balanced passes (7 rows: 3 + 4), none above ROWS_PER_PASS.
    let pass = |i: usize| i * args.rows / passes..(i + 1) * args.rows / passes;
    let wide = 8 * ROW_VECS;
    let wrap = Ahead::wrap(base, width);
    let mut acc_tail = [0.0f32; 16];
    for g in base.groups.clone() {
        let mut o = 0;
        while o + wide <= width {
            let ahead = wrap.at(o, width);
            for i in 0..passes {
                // SAFETY: the token proves the features; the strip's columns
                // lie inside the matrix and every row of `ys` (checked
                // above and in `strip_rows`).
                unsafe {
                    strip_pass::<ROW_VECS>(args, g, o0, o, pass(i), ys, (i == 0).then_some(ahead))
                }
            }
            o += wide;
        }
        while o + 8 <= width {
            for i in 0..passes {
                // SAFETY: as above.
                unsafe { strip_pass::<1>(args, g, o0, o, pass(i), ys, None) }
            }
            o += 8;
        }
        if o < width {
            let n = width - o;
            for (r, y) in ys.iter_mut().enumerate() {
                scalar_group(&args.row(r), g, o0 + o, &mut acc_tail[..n], &mut y[o..]);
            }
        }
    }
}

/// One pass of [`strip_rows`] over the rows `rows` (1 to 4 of them).
///
/// # Safety
/// None beyond the features (AVX2 and FMA), which the caller's token proves.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn strip_pass<const V: usize>(
    args: &RowsArgs,
    g: usize,
    o0: usize,
    o: usize,
    rows: std::ops::Range<usize>,
    ys: &mut [&mut [f32]],
    ahead: Option<Ahead>,
) {
    let ys = &mut ys[rows.clone()];
    let r0 = rows.start;
    // SAFETY: (every arm) the caller's token proves the features, and `ys`
    // holds exactly the pass's rows.
    unsafe {
        match ys.len() {
            4 => strip_rows::<4, V>(args, g, o0 + o, o, r0, ys, ahead),
            3 => strip_rows::<3, V>(args, g, o0 + o, o, r0, ys, ahead),
            2 => strip_rows::<2, V>(args, g, o0 + o, o, r0, ys, ahead),
            _ => strip_rows::<1, V>(args, g, o0 + o, o, r0, ys, ahead),
        }
    }
}

/// One group's contribution to `V * 8` columns from `c0` (column `o` of
/// the task's outputs `ys`) for the `R` rows of `x` from `r0`.
///
/// # Safety
/// None beyond the features (AVX2 and FMA); every index is checked.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn strip_rows<const R: usize, const V: usize>(
    args: &RowsArgs,
    g: usize,
    c0: usize,
    o: usize,
    r0: usize,
    ys: &mut [&mut [f32]],
    ahead: Option<Ahead>,
) {
    let base = &args.base;
    let half = base.group_size / 2;
    let n = base.out_feat;
    let p_end = (g + 1) * half;
    assert!(ys.len() == R && ys.iter().all(|y| y.len() >= o + 8 * V));
    assert!(p_end * n <= base.data.len() && c0 + 8 * V <= n);
    assert!(2 * p_end <= args.pitch && (r0 + R) * args.pitch <= base.xs.len());
    let mask_hi = _mm256_set1_epi32(!0xF);
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    if let Some(a) = ahead {
        a.prefetch_scales(base, g, c0, (32 * V).div_ceil(64));
    }
    let xs = base.xs.as_ptr().wrapping_add(r0 * args.pitch);
    for p in g * half..p_end {
        // SAFETY: the row slice and the xs indices are in bounds (asserted
        // above); `_mm_loadl_epi64` reads 8 bytes.
        unsafe {
            let row = base.data.as_ptr().add(p * n + c0);
            if let Some(a) = ahead {
                a.prefetch_row(row, 1);
            }
            let mut lo = [_mm256_setzero_ps(); V];
            let mut hi = [_mm256_setzero_ps(); V];
            for v in 0..V {
                let bytes = _mm_loadl_epi64(row.add(8 * v) as *const __m128i);
                let wide = _mm256_cvtepi8_epi32(bytes);
                lo[v] = _mm256_cvtepi32_ps(_mm256_slli_epi32::<28>(wide));
                hi[v] = _mm256_cvtepi32_ps(_mm256_and_si256(wide, mask_hi));
            }
            for (r, ar) in acc.iter_mut().enumerate() {
                let xr = xs.add(r * args.pitch + 2 * p);
                let x0 = _mm256_set1_ps(*xr);
                let x1 = _mm256_set1_ps(*xr.add(1));
                for v in 0..V {
                    ar[v] = _mm256_fmadd_ps(lo[v], x0, ar[v]);
                    ar[v] = _mm256_fmadd_ps(hi[v], x1, ar[v]);
                }
            }
        }
    }
    let srow = &base.scales[g * n + c0..g * n + c0 + 8 * V];
    for (ar, y) in acc.iter().zip(ys.iter_mut()) {
        for (v, a) in ar.iter().enumerate() {
            // SAFETY: y holds o + 8 V floats and srow 8 V (asserted above);
            // unaligned loads and stores.
            unsafe {
                let yp = y.as_mut_ptr().add(o + 8 * v);
                let s = _mm256_loadu_ps(srow.as_ptr().add(8 * v));
                _mm256_storeu_ps(yp, _mm256_fmadd_ps(*a, s, _mm256_loadu_ps(yp)));
            }
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
    tok: Avx2,
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    out: &mut [[f32; NR]],
) {
    assert!(
        out.len() >= M,
        "gemm_micro: out holds {} rows, M = {M}",
        out.len()
    );
    // SAFETY: `out` is exclusively borrowed and holds at least M rows of NR
    // contiguous floats, i.e. M rows at stride NR; `a` and `b` as the caller
    // guarantees.
    unsafe { gemm_micro_into::<M>(tok, a, lda, b, kc, out.as_mut_ptr().cast(), NR, false) }
}

/// [`gemm_micro`] straight on the output: `y[m][0..NR] = sum_k a[m * lda
/// + k] * b[k * NR ..]` for the `M` rows of `y` (stride `ldy`), or `+=`
/// with `accumulate` (the depth blocks after the first). The accumulators
/// start from `y`, so no staging buffer and no second pass over it.
///
/// # Safety
/// The token proves AVX2 + FMA; the caller guarantees that `a` holds `M`
/// rows of at least `kc` floats at stride `lda`, `b` holds `kc * NR`, and
/// `y` points to `M` rows of `NR` floats at stride `ldy` that no other
/// thread accesses during the call.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_micro_into<const M: usize>(
    _: Avx2,
    a: &[f32],
    lda: usize,
    b: &[f32],
    kc: usize,
    y: *mut f32,
    ldy: usize,
    accumulate: bool,
) {
    debug_assert!(b.len() >= kc * NR && a.len() >= (M - 1) * lda + kc);
    let mut c = [[_mm256_setzero_ps(); 4]; M];
    if accumulate {
        for (m, cm) in c.iter_mut().enumerate() {
            for (j, cv) in cm.iter_mut().enumerate() {
                // SAFETY: row m of y holds NR = 32 floats (the contract).
                *cv = unsafe { _mm256_loadu_ps(y.add(m * ldy + 8 * j)) };
            }
        }
    }
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for k in 0..kc {
        // SAFETY: k < kc, so b[k*NR .. k*NR + 32] and a[m*lda + k] are in
        // bounds per the contract.
        // The M broadcasts first, then one panel vector at a time: 12
        // accumulators, 3 broadcasts and 1 panel vector are the 16
        // registers (all four panel vectors live at once spill two
        // accumulators to the stack, which doubled the loop's latency).
        unsafe {
            let bk = bp.add(k * NR);
            let av: [__m256; M] = std::array::from_fn(|m| _mm256_set1_ps(*ap.add(m * lda + k)));
            for j in 0..4 {
                let bv = _mm256_loadu_ps(bk.add(8 * j));
                for (cm, a) in c.iter_mut().zip(av.iter()) {
                    cm[j] = _mm256_fmadd_ps(*a, bv, cm[j]);
                }
            }
        }
    }
    for (m, cm) in c.iter().enumerate() {
        for (j, cv) in cm.iter().enumerate() {
            // SAFETY: row m of y holds NR = 32 floats (the contract).
            unsafe { _mm256_storeu_ps(y.add(m * ldy + 8 * j), *cv) };
        }
    }
}

/// The tile dequantizer: full panels (`NR` columns) of an even depth from
/// an even first row decode one packed byte row (rows `2p` and `2p + 1` of
/// W, one group) per step, 8 columns per vector: the byte sign-extended to
/// i32, shifted left and arithmetically right by 28 for the low nibble and
/// right by 4 for the high one, converted and multiplied by the scale,
/// the same single f32 rounding as `dequant_tile_scalar`, so the panels
/// are bit for bit the scalar ones. Other panels run the scalar code.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dequant_tile(_: Avx2, t: &TileArgs, packed: &mut [f32]) {
    if !t.k0.is_multiple_of(2) || !t.kc.is_multiple_of(2) {
        return dequant_tile_scalar(t, packed);
    }
    let n = t.out_feat;
    let (p0, pairs) = (t.k0 / 2, t.kc / 2);
    for j in 0..t.nc.div_ceil(NR) {
        let cj = t.c0 + j * NR;
        let panel = &mut packed[j * panel_stride(t.kc)..][..t.kc * NR];
        if NR.min(t.c0 + t.nc - cj) < NR {
            let part = TileArgs {
                c0: cj,
                nc: t.c0 + t.nc - cj,
                ..*t
            };
            dequant_tile_scalar(&part, panel);
            continue;
        }
        for (p, dst) in (p0..p0 + pairs).zip(panel.chunks_exact_mut(2 * NR)) {
            let g = 2 * p / t.group_size;
            let src = &t.data[p * n + cj..p * n + cj + NR];
            let sc = &t.scales[g * n + cj..g * n + cj + NR];
            for v in 0..NR / 8 {
                // SAFETY: src holds NR bytes, sc NR floats and dst 2 NR
                // floats (the slices above), and v * 8 + 8 <= NR.
                unsafe {
                    let bytes = _mm_loadl_epi64(src.as_ptr().add(8 * v) as *const __m128i);
                    let wide = _mm256_cvtepi8_epi32(bytes);
                    let lo = _mm256_srai_epi32::<28>(_mm256_slli_epi32::<28>(wide));
                    let hi = _mm256_srai_epi32::<4>(wide);
                    let s = _mm256_loadu_ps(sc.as_ptr().add(8 * v));
                    let d = dst.as_mut_ptr().add(8 * v);
                    _mm256_storeu_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), s));
                    _mm256_storeu_ps(d.add(NR), _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s));
                }
            }
        }
    }
}
