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
//! - a block's maps (`GgmlType::factors`: for the k-quants the 6-bit scales
//!   unpacked and multiplied out) are computed once per row and call, when
//!   the pass reaches the block;
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

use super::{Factors, GgmlType};
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
    for (p, o) in out.chunks_mut(ROWS).enumerate() {
        let first = r0 + p * ROWS;
        let at = |i: usize| data[(first + i) * row_bytes..].as_ptr();
        // SAFETY: (every arm) the token proves AVX2 and FMA; each row
        // pointer starts `row_bytes` readable bytes (asserted above), the
        // whole blocks that `x` spans.
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

/// Block `k` of the row at `row`.
///
/// # Safety
/// The row holds at least `k + 1` blocks of `T`.
#[inline(always)]
unsafe fn block<'a, T: GgmlType>(row: *const u8, k: usize) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(row.add(k * T::BYTES), T::BYTES) }
}

/// The dots of `R` rows (see the module docs).
///
/// # Safety
/// None beyond the token (AVX2 and FMA); each row pointer has
/// `x.len() / ELEMS * BYTES` readable bytes and `x.len()` is a multiple of
/// `ELEMS`.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<T: GgmlType, const R: usize>(
    _: Avx2,
    x: &[f32],
    rows: [*const u8; R],
) -> [f32; R] {
    let blocks = x.len() / T::ELEMS;
    let px = x.as_ptr();
    let mut tot = [_mm256_setzero_ps(); R];
    let mut mins = [_mm256_setzero_ps(); R];
    // The maps of the k-quants' eight or sixteen sub-blocks, per row. A
    // plain array and loop, not `std::array::from_fn`: the closure form is
    // not inlined into this `#[target_feature]` function. The one-map
    // types (32 weights per block) read theirs beside the codes instead,
    // so that only `a_0` and `c_0` are formed, not 32 floats per row.
    let mut maps: [Factors; R] = [([0f32; super::MAX_SUBS], [0f32; super::MAX_SUBS]); R];
    for k in 0..blocks {
        if T::ELEMS > 32 {
            for (m, &row) in maps.iter_mut().zip(&rows) {
                // SAFETY: block `k < blocks` is inside the row (the
                // function's contract).
                *m = T::factors(unsafe { block::<T>(row, k) });
            }
        }
        for c in 0..T::ELEMS / 32 {
            // SAFETY: the chunk's 32 inputs are inside `x` and its codes
            // inside the row's block `k` (the function's contract).
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
                for i in 0..R {
                    let b = block::<T>(rows[i], k);
                    let w = widen(T::codes32_x86(b.as_ptr(), c));
                    let p0 = _mm256_fmadd_ps(w[1], xv[1], _mm256_mul_ps(w[0], xv[0]));
                    if T::SUB == 32 {
                        let (a, cm) = if T::ELEMS == 32 {
                            let (a, cm) = T::factors(b);
                            (a[0], cm[0])
                        } else {
                            (maps[i].0[c], maps[i].1[c])
                        };
                        let p = _mm256_fmadd_ps(w[2], xv[2], p0);
                        let p = _mm256_fmadd_ps(w[3], xv[3], p);
                        tot[i] = _mm256_fmadd_ps(p, _mm256_set1_ps(a), tot[i]);
                        if T::AFFINE {
                            mins[i] = _mm256_fmadd_ps(s0, _mm256_set1_ps(cm), mins[i]);
                        }
                    } else {
                        let (a, cm) = (&maps[i].0, &maps[i].1);
                        let p1 = _mm256_fmadd_ps(w[3], xv[3], _mm256_mul_ps(w[2], xv[2]));
                        tot[i] = _mm256_fmadd_ps(p0, _mm256_set1_ps(a[2 * c]), tot[i]);
                        tot[i] = _mm256_fmadd_ps(p1, _mm256_set1_ps(a[2 * c + 1]), tot[i]);
                        if T::AFFINE {
                            mins[i] = _mm256_fmadd_ps(s0, _mm256_set1_ps(cm[2 * c]), mins[i]);
                            mins[i] = _mm256_fmadd_ps(s1, _mm256_set1_ps(cm[2 * c + 1]), mins[i]);
                        }
                    }
                }
            }
        }
    }
    let mut out = [0f32; R];
    for (o, (t, m)) in out.iter_mut().zip(tot.iter().zip(&mins)) {
        // SAFETY: AVX2 is enabled.
        // (No `+ 0.0` for the types without a minimum.)
        *o = unsafe {
            if T::AFFINE {
                _mm256_add_ps(*t, *m).hsum()
            } else {
                t.hsum()
            }
        };
    }
    out
}
