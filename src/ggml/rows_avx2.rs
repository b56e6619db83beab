//! The AVX2 float32-activation row dot of every block type, several output
//! rows per pass over `x` (the batch-1 forward of `GgufWeight`, and the
//! lone row of `fused::dot_row`).
//!
//! Why this shape (measured on Zen 3, docs/benchmarks.md "GGUF block
//! weights"): the per-row body it replaces (`body.rs`, kept for AVX-512)
//! wrote each block's codes to a buffer and read them back, summed `x` again
//! for every row, and for the k-quants its per-sub-block closure was not
//! inlined into the `#[target_feature]` function, so every intrinsic became
//! a call (Q4_K / Q5_K ran 20 to 30 times slower than Q4_0). Here
//! - [`ROWS`] output rows share each load of `x` and, for the types with a
//!   minimum, its per-sub-block sum (four adds per 32 inputs per pass, not
//!   per row);
//! - the codes of 32 weights stay in one register (`GgmlType::codes32_x86`,
//!   the extraction the int8-activation bodies use) and are widened to f32
//!   lanes from it: no trip through memory;
//! - the maps of a pass's rows (`GgmlType::factors`: the halves converted
//!   and, for the k-quants, the 6-bit scales unpacked and multiplied out)
//!   are written to a buffer once per row and call, before the pass: the
//!   pass itself then has no call in it (the half conversion's rare path is
//!   a call, and a call inside the loop forces every accumulator out to the
//!   stack, all vector registers being caller-saved);
//! - one product chain per row and sub-block, one FMA with `a_j` into the
//!   row's total, and one FMA `c_j * sum(x)` into the row's minimum total:
//!   the rows' chains are independent.
//!
//! Rounding: per sub-block `sum(q x)` in one f32 chain per lane and one FMA
//! with `a_j`; `sum(x)` per lane in three adds and one FMA with `c_j`; one
//! horizontal sum per row: within `(in + 2) * eps_f32 * sum_i (|a q_i| +
//! |c|) |x_i|` of the float64 dot of the dequantized row, `fused.rs`'s
//! bound.

use std::arch::x86_64::*;

use super::GgmlType;
use crate::simd::{Avx2, F32Lanes};

/// Output rows one pass serves: per row a total, a minimum total and the
/// product chain, beside the four `x` registers and the widened codes
/// (16 registers at 4 rows, none spilled).
const ROWS: usize = 4;

/// `out[i] = row (r0 + i) . x` for the rows of `data`, `row_bytes` bytes
/// (whole blocks of `T`) each, `x` their `row_bytes / BYTES * ELEMS` inputs.
pub(crate) fn dot_rows<T: GgmlType>(
    t: Avx2,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    out: &mut [f32],
) {
    assert!(
        row_bytes.is_multiple_of(T::BYTES)
            && x.len() == row_bytes / T::BYTES * T::ELEMS
            && data.len() >= (r0 + out.len()) * row_bytes
    );
    let blocks = x.len() / T::ELEMS;
    let subs = blocks * (T::ELEMS / T::SUB);
    // Per row of a pass, `a_j` of every sub-block then `c_j` of every one.
    let mut dm = vec![0f32; ROWS * 2 * subs];
    for (p, o) in out.chunks_mut(ROWS).enumerate() {
        let first = r0 + p * ROWS;
        for (i, m) in dm.chunks_exact_mut(2 * subs).take(o.len()).enumerate() {
            let row = &data[(first + i) * row_bytes..(first + i + 1) * row_bytes];
            row_maps::<T>(row, m);
        }
        let at = |i: usize| Row {
            codes: data[(first + i) * row_bytes..].as_ptr(),
            dm: dm[i * 2 * subs..].as_ptr(),
        };
        // SAFETY: (every arm) the token proves AVX2 and FMA; each row's
        // codes start `row_bytes` readable bytes (asserted above), the whole
        // blocks that `x` spans, and its maps `2 * subs` floats.
        unsafe {
            match o.len() {
                4 => o.copy_from_slice(&kernel::<T, 4>(t, x, [at(0), at(1), at(2), at(3)])),
                3 => o.copy_from_slice(&kernel::<T, 3>(t, x, [at(0), at(1), at(2)])),
                2 => o.copy_from_slice(&kernel::<T, 2>(t, x, [at(0), at(1)])),
                _ => o.copy_from_slice(&kernel::<T, 1>(t, x, [at(0)])),
            }
        }
    }
}

/// One row of a pass: its code bytes and its maps (`a` of its `n`
/// sub-blocks, then `c`).
#[derive(Clone, Copy)]
struct Row {
    codes: *const u8,
    dm: *const f32,
}

/// The maps of `row` (whole blocks of `T`) into `dm`: `a_j` at `j`, `c_j`
/// at `n + j` for its `n = dm.len() / 2` sub-blocks.
fn row_maps<T: GgmlType>(row: &[u8], dm: &mut [f32]) {
    let (a, c) = dm.split_at_mut(dm.len() / 2);
    if T::ELEMS == 32 {
        // One map per block: its halves (`factors` would form 32 floats).
        for ((b, a), c) in row.chunks_exact(T::BYTES).zip(a).zip(c) {
            let (fa, fc) = T::factors(b);
            (*a, *c) = (fa[0], fc[0]);
        }
        return;
    }
    let per = T::ELEMS / T::SUB;
    for ((b, ab), cb) in row
        .chunks_exact(T::BYTES)
        .zip(a.chunks_exact_mut(per))
        .zip(c.chunks_exact_mut(per))
    {
        let (fa, fc) = T::factors(b);
        ab.copy_from_slice(&fa[..per]);
        cb.copy_from_slice(&fc[..per]);
    }
}

/// The 32 signed codes of `q` as four f32 vectors, inputs `0..8`, `8..16`,
/// `16..24`, `24..32`.
#[inline(always)]
unsafe fn widen(q: __m256i) -> [__m256; 4] {
    // SAFETY: AVX2 (the caller's features).
    unsafe {
        let lo = _mm256_castsi256_si128(q);
        let hi = _mm256_extracti128_si256::<1>(q);
        let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        [
            f(lo),
            f(_mm_unpackhi_epi64(lo, lo)),
            f(hi),
            f(_mm_unpackhi_epi64(hi, hi)),
        ]
    }
}

/// The dots of `R` rows (see the module docs).
///
/// # Safety
/// None beyond the token (AVX2 and FMA); each row's `codes` has
/// `x.len() / ELEMS * BYTES` readable bytes and its `dm` two floats per
/// sub-block of `x.len()` (a multiple of `ELEMS`) inputs.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<T: GgmlType, const R: usize>(_: Avx2, x: &[f32], rows: [Row; R]) -> [f32; R] {
    let blocks = x.len() / T::ELEMS;
    let subs = x.len() / T::SUB;
    let px = x.as_ptr();
    let mut tot = [_mm256_setzero_ps(); R];
    let mut mins = [_mm256_setzero_ps(); R];
    for k in 0..blocks {
        for c in 0..T::ELEMS / 32 {
            // SAFETY: the chunk's 32 inputs are inside `x`, its codes inside
            // each row's block `k`, and sub-block `j < subs` has its maps in
            // each row's `dm` (the function's contract).
            unsafe {
                let xc = px.add(k * T::ELEMS + 32 * c);
                let xv = [
                    _mm256_loadu_ps(xc),
                    _mm256_loadu_ps(xc.add(8)),
                    _mm256_loadu_ps(xc.add(16)),
                    _mm256_loadu_ps(xc.add(24)),
                ];
                // `sum(x)` per lane of the chunk's one sub-block (SUB 32)
                // or its two (SUB 16), for the minimums' term.
                let (s0, s1) = if T::AFFINE {
                    let (a, b) = (_mm256_add_ps(xv[0], xv[1]), _mm256_add_ps(xv[2], xv[3]));
                    if T::SUB == 32 {
                        (_mm256_add_ps(a, b), b)
                    } else {
                        (a, b)
                    }
                } else {
                    (_mm256_setzero_ps(), _mm256_setzero_ps())
                };
                // The chunk's first sub-block.
                let j = (k * T::ELEMS + 32 * c) / T::SUB;
                for i in 0..R {
                    let row = rows[i];
                    let w = widen(T::codes32_x86(row.codes.add(k * T::BYTES), c));
                    // (Pointers, not closures: a closure is not inlined
                    // into a `#[target_feature]` function.)
                    let (pa, pc) = (row.dm.add(j), row.dm.add(subs + j));
                    let p0 = _mm256_fmadd_ps(w[1], xv[1], _mm256_mul_ps(w[0], xv[0]));
                    if T::SUB == 32 {
                        let p = _mm256_fmadd_ps(w[2], xv[2], p0);
                        let p = _mm256_fmadd_ps(w[3], xv[3], p);
                        tot[i] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&*pa), tot[i]);
                        if T::AFFINE {
                            mins[i] = _mm256_fmadd_ps(s0, _mm256_broadcast_ss(&*pc), mins[i]);
                        }
                    } else {
                        let p1 = _mm256_fmadd_ps(w[3], xv[3], _mm256_mul_ps(w[2], xv[2]));
                        tot[i] = _mm256_fmadd_ps(p0, _mm256_broadcast_ss(&*pa), tot[i]);
                        tot[i] = _mm256_fmadd_ps(p1, _mm256_broadcast_ss(&*pa.add(1)), tot[i]);
                        if T::AFFINE {
                            mins[i] = _mm256_fmadd_ps(s0, _mm256_broadcast_ss(&*pc), mins[i]);
                            mins[i] =
                                _mm256_fmadd_ps(s1, _mm256_broadcast_ss(&*pc.add(1)), mins[i]);
                        }
                    }
                }
            }
        }
    }
    // SAFETY: AVX2 is enabled.
    unsafe { row_totals(&tot, &mins, T::AFFINE) }
}

/// Each row's dot from its lanes: the horizontal sum of its total plus, for
/// the types with a minimum (`affine`), its minimum total (no `+ 0.0`
/// otherwise: it would turn a -0.0 dot into +0.0). Shared by the AVX2
/// multi-row kernels (`legacy_avx2.rs` too).
///
/// # Safety
/// AVX2 in force (the caller's features).
#[inline(always)]
pub(super) unsafe fn row_totals<const R: usize>(
    tot: &[__m256; R],
    mins: &[__m256; R],
    affine: bool,
) -> [f32; R] {
    let mut out = [0f32; R];
    for (o, (t, m)) in out.iter_mut().zip(tot.iter().zip(mins)) {
        // SAFETY: the caller's features.
        *o = unsafe {
            if affine {
                _mm256_add_ps(*t, *m).hsum()
            } else {
                t.hsum()
            }
        };
    }
    out
}
