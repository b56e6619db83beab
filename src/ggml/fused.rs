//! The fused row dot and the block decode of every type, at the level a
//! `crate::linear::dispatch::Dots` proves: the scalar references here, the
//! AVX2 / AVX-512 bodies in `avx2.rs` / `avx512.rs`.
//!
//! The dot is `sum_j a_j * sum_{i in j} q_i x_i + c_j * sum_{i in j} x_i`
//! over the sub-blocks `j` of every block (`GgmlType::factors`, `codes`):
//! no float weight is formed. It reassociates the exact weight's products,
//! so it is within `(in + 2) * eps_f32 * sum_i (|a q_i| + |c|) |x_i|` of the
//! float64 dot of the dequantized row. The AVX2 kernel of the 32-weight
//! types (`legacy_avx2.rs`) sums the unsigned codes `n = q + bias` and
//! `-bias * sum(x)` instead (`GgmlType::LEGACY`): for it `(a, q, c)` above
//! read `(d, n, c - bias d)`, a bound at most `1 + 2 bias / |q|` times
//! larger per weight (Q4_0: bias 8; Q5_0: 16; the others 0).

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use super::{Codes, GgmlType, Legacy, MAX_BLOCK_ELEMS};
use crate::linear::dispatch::Dots;

/// `row . x` for `row` whole blocks of `T` and `x` their weights' inputs.
pub(crate) fn dot_row<T: GgmlType>(dots: Dots, row: &[u8], x: &[f32]) -> f32 {
    assert!(row.len().is_multiple_of(T::BYTES) && x.len() == row.len() / T::BYTES * T::ELEMS);
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL (and AVX2); lengths
        // checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::dot_row::<T>(t, row, x) },
        // A 32-weight type with F16C: its own kernel (one row).
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(_, Some(f)) if T::LEGACY != Legacy::No => {
            let mut out = [0f32];
            super::legacy_avx2::dot_rows::<T>(f, row, row.len(), 0, x, &mut out);
            out[0]
        }
        // SAFETY: the token proves AVX2 and FMA; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => avx2::dot_row::<T>(t, row, x),
        Dots::Scalar => dot_row_scalar::<T>(row, x),
    }
}

/// `out[i] = row (r0 + i) . x` for the rows of `data` (`row_bytes` bytes
/// of whole blocks of `T` each): at AVX2 several rows per pass over `x`
/// (with F16C `legacy_avx2.rs` for the 32-weight types and `rows_k_avx2.rs`
/// for the k-quants, `rows_avx2.rs` otherwise), at the other levels
/// [`dot_row`] row by row. Each value is within [`dot_row`]'s bound.
pub(crate) fn dot_rows<T: GgmlType>(
    dots: Dots,
    data: &[u8],
    row_bytes: usize,
    r0: usize,
    x: &[f32],
    out: &mut [f32],
) {
    assert!(data.len() >= (r0 + out.len()) * row_bytes);
    match dots {
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, f16c) => match (T::ELEMS, T::LEGACY, f16c) {
            (256, _, Some(f)) => {
                if !super::rows_k_avx2::dot_rows::<T>(f, data, row_bytes, r0, x, out) {
                    for (i, o) in out.iter_mut().enumerate() {
                        let r = r0 + i;
                        *o = dot_row_scalar::<T>(&data[r * row_bytes..(r + 1) * row_bytes], x);
                    }
                }
            }
            (_, l, Some(f)) if l != Legacy::No => {
                super::legacy_avx2::dot_rows::<T>(f, data, row_bytes, r0, x, out)
            }
            _ => super::rows_avx2::dot_rows::<T>(t, data, row_bytes, r0, x, out),
        },
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                let r = r0 + i;
                *o = dot_row::<T>(dots, &data[r * row_bytes..(r + 1) * row_bytes], x);
            }
        }
    }
}

/// The scalar reference of [`dot_row`]: the same sums, in input order
/// within each sub-block.
pub(crate) fn dot_row_scalar<T: GgmlType>(row: &[u8], x: &[f32]) -> f32 {
    let mut q: Codes = [0; MAX_BLOCK_ELEMS];
    row.chunks_exact(T::BYTES)
        .zip(x.chunks_exact(T::ELEMS))
        .map(|(b, xb)| {
            T::codes(b, &mut q);
            let (a, c) = T::factors(b);
            let sub = |j: usize| {
                let (mut p, mut s) = (0f32, 0f32);
                for i in j * T::SUB..(j + 1) * T::SUB {
                    p += f32::from(q[i]) * xb[i];
                    s += xb[i];
                }
                a[j] * p + if T::AFFINE { c[j] * s } else { 0.0 }
            };
            (0..T::ELEMS / T::SUB).map(sub).sum::<f32>()
        })
        .sum()
}

/// Block `b` (`BYTES` bytes) decoded into `out` (`ELEMS` floats), bit for
/// bit `T::dequantize_block` at every level (the tile decode of the
/// batched forward).
pub(crate) fn decode_block<T: GgmlType>(dots: Dots, b: &[u8], out: &mut [f32]) {
    assert!(b.len() == T::BYTES && out.len() == T::ELEMS);
    match dots {
        // SAFETY: the token proves AVX-512 F/BW/VL (and AVX2); lengths
        // checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx512(t) => unsafe { avx512::decode_block::<T>(t, b, out) },
        // SAFETY: the token proves AVX2 and FMA; lengths checked above.
        #[cfg(target_arch = "x86_64")]
        Dots::Avx2(t, _) => unsafe { avx2::decode_block::<T>(t, b, out) },
        Dots::Scalar => T::dequantize_block(b, out),
    }
}
