//! `activations = "int8"` for every block type: `x` quantized once per
//! call to int8 blocks of the weight's block size ([`Xq`]: 32 inputs for
//! the legacy types as ggml's Q8_0, 256 with sums per sub-block for the
//! k-quants as ggml's Q8_K), then integer dot products per sub-block and
//! one float expression per block (`GgmlType::a8_value`, ggml's
//! `vec_dot_<type>_q8_<0|K>` formulas: the minimums fold into one integer
//! multiply per sub-block against the activation sums).
//!
//! The scalar twin ([`dot_row_a8_scalar`]) defines the result bit for bit:
//! the integer sums are exact, so the SIMD bodies (`a8_x86.rs`: AVX2
//! `vpmaddubsw` / `vpmaddwd`, AVX-512 VNNI `vpdpbusd` / `vpdpwssd`) may
//! add them in any order; the block values go into four float
//! accumulators by block index mod 4, combined `(a0 + a1) + (a2 + a3)`.
//! With AVX2, eight weight rows share one pass over `x`
//! (`a8_legacy_x86.rs`, `a8_kquant_x86.rs`, and for Q4_K / Q5_K at two or
//! more activation rows `a8_kquant_lanes_x86.rs`): their exact block sums
//! land in the lanes of one register per block, and each lane evaluates
//! the same block value and accumulators as the twin.
//!
//! Error: with `|x_i - dx xq_i| <= dx / 2` per activation block, the dot
//! is within `sum_blocks dx / 2 * sum_i |w_i|` of the float64 dot of the
//! dequantized row, plus float32 rounding of the per-block products and
//! the sums (`tests.rs` checks it).

use super::xq::{Xq, XqRow};
#[cfg(target_arch = "x86_64")]
use super::{a8_kquant_lanes_x86, a8_kquant_x86, a8_legacy_x86, a8_x86};
use super::{Codes, GgmlType, MAX_BLOCK_ELEMS};
use crate::simd::{self, SimdLevel};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx2F16c, Avx512, Avx512Vnni};

/// The int8-activation kernels of one level, with their tokens.
#[derive(Clone, Copy, Debug)]
pub(crate) enum A8Dots {
    Scalar,
    /// AVX2 `vpmaddubsw` / `vpmaddwd` (F16C for the block scales).
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2F16c),
    /// 256-bit AVX-512 VNNI `vpdpbusd` / `vpdpwssd`.
    #[cfg(target_arch = "x86_64")]
    Vnni(Avx512Vnni),
}

impl A8Dots {
    /// The kernels of the level in force.
    pub(crate) fn current() -> A8Dots {
        Self::at(simd::level())
    }

    /// The best kernels allowed at `level` (never above the level in force).
    pub(crate) fn at(level: SimdLevel) -> A8Dots {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = Avx512::at(level).and_then(Avx512::vnni) {
                return A8Dots::Vnni(t);
            }
            if let Some(t) = Avx2::at(level).and_then(Avx2::f16c) {
                return A8Dots::Avx2(t);
            }
        }
        let _ = level;
        A8Dots::Scalar
    }
}

/// Rows of activations one pass over a weight row serves.
const PASS_ROWS: usize = 4;

/// Rows of activations one pass of the AVX2 eight-row legacy body serves
/// first (then [`PASS_ROWS`], then one): its codes of a block are
/// extracted and transposed once for this many rows. Q6_K's body stays at
/// [`PASS_ROWS`]: with eight, its per-row lane vectors (eight activation
/// rows times eight weight rows, twice) live on the stack, and one paired
/// run on Zen 3 (load 8-9) measured the k-quants 8 % slower at batch 16
/// that way. Q4_K and Q5_K take up to sixteen rows per pass with their
/// rows in lanes (`a8_kquant_lanes_x86.rs`), which keeps one int32 vector
/// per activation row.
#[cfg(target_arch = "x86_64")]
const WIDE_PASS_ROWS: usize = 8;

impl A8Dots {
    /// Weight rows that one pass of [`dot_row_a8`]'s widest bodies serves
    /// (the AVX2 eight-row bodies); callers that split the rows of a
    /// weight give it this many at a time.
    pub(crate) const WEIGHT_ROWS: usize = 8;
}

#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    a8_legacy_x86::LEGACY_ROWS == A8Dots::WEIGHT_ROWS
        && a8_kquant_x86::KQUANT_ROWS == A8Dots::WEIGHT_ROWS
        && a8_kquant_lanes_x86::LANES_ROWS == A8Dots::WEIGHT_ROWS
);

/// `w . x` for every weight row `w` of `rows` (one or more whole rows of
/// blocks of `T`) and every row of `x` into `out` `[weight rows, x rows]`:
/// `x` quantized for `T` by [`Xq::quantize`]. Activation rows go four at a
/// time through one pass over the weight rows; with AVX2 eight weight rows
/// go through one pass where the type has such a body
/// (`eight_rows_avx2`: legacy types eight activation rows at a time, then
/// four; Q4_K / Q5_K sixteen). Every result is [`dot_row_a8_scalar`]'s bit
/// for bit.
pub(crate) fn dot_row_a8<T: GgmlType>(dots: A8Dots, rows: &[u8], x: &Xq, out: &mut [f32]) {
    let stride = x.in_feat / T::ELEMS * T::BYTES;
    let batch = x.q.len() / x.in_feat.max(1);
    assert!(
        x.elems == T::ELEMS
            && x.sub == T::SUB
            && x.in_feat.is_multiple_of(T::ELEMS)
            && stride > 0
            && rows.len().is_multiple_of(stride)
            && out.len() == rows.len() / stride * batch
            && batch * x.in_feat == x.q.len()
    );
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if let A8Dots::Avx2(t) = dots {
        done = eight_rows_avx2::<T>(t, rows, stride, x, batch, out);
    }
    for (row, o) in rows
        .chunks_exact(stride)
        .zip(out.chunks_exact_mut(batch))
        .skip(done)
    {
        let mut b = 0;
        while b + PASS_ROWS <= batch {
            let xs: [XqRow<'_>; PASS_ROWS] = std::array::from_fn(|i| x.row(b + i));
            o[b..b + PASS_ROWS].copy_from_slice(&dots_rows::<T, PASS_ROWS>(dots, row, &xs));
            b += PASS_ROWS;
        }
        while b < batch {
            o[b] = dots_rows::<T, 1>(dots, row, &[x.row(b)])[0];
            b += 1;
        }
    }
}

/// The AVX2 eight-row passes of [`dot_row_a8`] over the first whole
/// groups of eight weight rows; returns how many rows they did (0 for a
/// type without an eight-row body): activation rows eight (legacy types)
/// or four at a time, then one at a time, through `a8_legacy_x86.rs` (32
/// weights per block) or `a8_kquant_x86.rs`; for Q4_K / Q5_K up to
/// sixteen at a time through `a8_kquant_lanes_x86.rs` (a last single row
/// through `a8_kquant_x86.rs`, whose one-row body is faster: the
/// per-block transposes serve only one row there).
#[cfg(target_arch = "x86_64")]
fn eight_rows_avx2<T: GgmlType>(
    t: Avx2F16c,
    rows: &[u8],
    stride: usize,
    x: &Xq,
    batch: usize,
    out: &mut [f32],
) -> usize {
    use a8_kquant_lanes_x86::{dot_rows8_lanes_avx2, lanes_layout, LANES_PASS_ROWS};
    use a8_kquant_x86::{dot_rows8_kquant_avx2, has_kquant_body};
    use a8_legacy_x86::dot_rows8_avx2;
    const W: usize = A8Dots::WEIGHT_ROWS;
    let legacy = T::ELEMS == 32;
    let kquant = T::ELEMS == 256 && has_kquant_body(T::GGML_TYPE);
    if !(legacy || kquant) {
        return 0;
    }
    let put = |o8: &mut [f32], b: usize, v: &[f32; W]| {
        for (w, &y) in v.iter().enumerate() {
            o8[w * batch + b] = y;
        }
    };
    // One activation row keeps the loop below (the one-row k-quant body):
    // the lanes body's per-block transposes would serve one row only.
    if T::ELEMS == 256 && batch >= 2 && lanes_layout(T::GGML_TYPE).is_some() {
        let mut v = [[0f32; W]; LANES_PASS_ROWS];
        let mut done = 0;
        for (w8, o8) in rows
            .chunks_exact(W * stride)
            .zip(out.chunks_exact_mut(W * batch))
        {
            for c in 0..batch.div_ceil(LANES_PASS_ROWS) {
                // The pass's activation rows on the stack: this runs once
                // per task of eight weight rows, and a `Vec` of them was a
                // heap allocation per task at every batch from 2.
                let b0 = c * LANES_PASS_ROWS;
                let n = (batch - b0).min(LANES_PASS_ROWS);
                let first = x.row(b0);
                let xa: [XqRow<'_>; LANES_PASS_ROWS] =
                    std::array::from_fn(|i| if i < n { x.row(b0 + i) } else { first });
                let xc = &xa[..n];
                let vc = &mut v[..n];
                if let [x1] = xc {
                    // SAFETY: the token proves AVX2, FMA and F16C; `T` is a
                    // k-quant of `has_kquant_body`; lengths checked by
                    // `dot_row_a8`.
                    vc[0] = unsafe { dot_rows8_kquant_avx2::<T, 1>(t, w8, stride, &[*x1]) }[0];
                } else {
                    // SAFETY: the token proves AVX2, FMA and F16C; `T` has a
                    // `lanes_layout`; lengths checked by `dot_row_a8`; at
                    // most `LANES_PASS_ROWS` rows, as many as `vc`.
                    unsafe { dot_rows8_lanes_avx2::<T>(t, w8, stride, xc, vc) };
                }
                for (i, vi) in vc.iter().enumerate() {
                    put(o8, c * LANES_PASS_ROWS + i, vi);
                }
            }
            done += W;
        }
        return done;
    }
    let mut done = 0;
    for (w8, o8) in rows
        .chunks_exact(W * stride)
        .zip(out.chunks_exact_mut(W * batch))
    {
        let mut b = 0;
        while legacy && b + WIDE_PASS_ROWS <= batch {
            let xs: [XqRow<'_>; WIDE_PASS_ROWS] = std::array::from_fn(|i| x.row(b + i));
            // SAFETY: the token proves AVX2, FMA and F16C; `T` is a legacy
            // type (32 weights per block); lengths checked by `dot_row_a8`.
            let v = unsafe { dot_rows8_avx2::<T, WIDE_PASS_ROWS>(t, w8, stride, &xs) };
            for (i, vi) in v.iter().enumerate() {
                put(o8, b + i, vi);
            }
            b += WIDE_PASS_ROWS;
        }
        while b + PASS_ROWS <= batch {
            let xs: [XqRow<'_>; PASS_ROWS] = std::array::from_fn(|i| x.row(b + i));
            // SAFETY: the token proves AVX2, FMA and F16C; `T` is a legacy
            // type (32 weights per block) or a k-quant of
            // `has_kquant_body`; lengths checked by `dot_row_a8`.
            let v = unsafe {
                if legacy {
                    dot_rows8_avx2::<T, PASS_ROWS>(t, w8, stride, &xs)
                } else {
                    dot_rows8_kquant_avx2::<T, PASS_ROWS>(t, w8, stride, &xs)
                }
            };
            for (i, vi) in v.iter().enumerate() {
                put(o8, b + i, vi);
            }
            b += PASS_ROWS;
        }
        while b < batch {
            let xs = [x.row(b)];
            // SAFETY: as above.
            let v = unsafe {
                if legacy {
                    dot_rows8_avx2::<T, 1>(t, w8, stride, &xs)
                } else {
                    dot_rows8_kquant_avx2::<T, 1>(t, w8, stride, &xs)
                }
            };
            put(o8, b, &v[0]);
            b += 1;
        }
        done += W;
    }
    done
}

/// `row . xs[r]` for `R` rows at the level `dots` (lengths checked by
/// [`dot_row_a8`]: every `XqRow` of an `Xq` of `T` for `row`'s inputs).
fn dots_rows<T: GgmlType, const R: usize>(
    dots: A8Dots,
    row: &[u8],
    xs: &[XqRow<'_>; R],
) -> [f32; R] {
    match dots {
        // SAFETY: the token proves AVX-512 VNNI (and AVX2, F16C); lengths
        // checked by the caller.
        #[cfg(target_arch = "x86_64")]
        A8Dots::Vnni(t) => unsafe { a8_x86::dot_rows_vnni::<T, R>(t, row, xs) },
        // SAFETY: the token proves AVX2, FMA and F16C; lengths checked by
        // the caller.
        #[cfg(target_arch = "x86_64")]
        A8Dots::Avx2(t) => unsafe { a8_x86::dot_rows_avx2::<T, R>(t, row, xs) },
        A8Dots::Scalar => xs.map(|x| dot_row_a8_scalar::<T>(row, x)),
    }
}

/// The sums of a block that are not the code dot: `(msum, xsum)`
/// (`GgmlType::a8_value`), from its minimums and activation sums per
/// sub-block.
#[inline(always)]
fn block_sums<T: GgmlType>(m: &[i16], sums: &[i32]) -> (i32, i32) {
    let (mut msum, mut xsum) = (0i32, 0i32);
    for (&mj, &s) in m.iter().zip(sums) {
        if T::AFFINE {
            msum += i32::from(mj) * s;
        }
        xsum += s;
    }
    (msum, xsum)
}

/// The scalar twin of [`dot_row_a8`]: per block the exact integer sums,
/// `T::a8_value`, four accumulators by block index mod 4.
pub(crate) fn dot_row_a8_scalar<T: GgmlType>(row: &[u8], x: XqRow<'_>) -> f32 {
    let subs = T::ELEMS / T::SUB;
    let mut acc = [0f32; 4];
    let mut codes: Codes = [0; MAX_BLOCK_ELEMS];
    for (bi, b) in row.chunks_exact(T::BYTES).enumerate() {
        T::codes(b, &mut codes);
        let (k, m) = T::a8_ints(b);
        let xq = &x.q[bi * T::ELEMS..(bi + 1) * T::ELEMS];
        let isum: i32 = (0..subs)
            .map(|j| {
                let r = j * T::SUB..(j + 1) * T::SUB;
                let s: i32 = codes[r.clone()]
                    .iter()
                    .zip(&xq[r])
                    .map(|(&c, &v)| i32::from(c) * i32::from(v))
                    .sum();
                i32::from(k[j]) * s
            })
            .sum();
        let (msum, xsum) = block_sums::<T>(&m[..subs], &x.sums[bi * subs..(bi + 1) * subs]);
        acc[bi % 4] += T::a8_value(b, x.d[bi], isum, msum, xsum);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}
