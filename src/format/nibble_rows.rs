//! What the output-major nibble-group formats (`int4_asym`, `int4_k`,
//! `int_zp`) share in their `WeightFormat` and `RowSource` implementations:
//! the blob's `dims` tensor and its half-precision tensors, and
//! (`row_source!`, `row_weight_basics!`, `row_engine_forward!`) the trait
//! methods that only hand the call to the weight or to the shared row
//! engine, so that each format file keeps only its layout and its own
//! forward and blob tensors.

use crate::error::{QuantError, Result};
use crate::linear::serde::{DType, Reader, Writer};

/// Little-endian u32 words.
pub(super) fn words(v: &[u8]) -> impl Iterator<Item = u32> + '_ {
    v.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

/// Write `dims` as the blob's first tensor, `dims` (u32 `[dims.len()]`).
pub(super) fn write_dims(out: &mut Writer, dims: &[usize]) {
    let bytes: Vec<u8> = dims
        .iter()
        .flat_map(|&v| (v as u32).to_le_bytes())
        .collect();
    out.tensor(DType::U32, &[dims.len()], &bytes);
}

/// Read the `dims` tensor [`write_dims`] wrote, exactly `n` of them.
pub(super) fn read_dims(r: &mut Reader<'_>, n: usize) -> Result<Vec<usize>> {
    let (d, dims) = r.tensor("dims", DType::U32)?;
    if d != [n] {
        return Err(QuantError::ser(format!("dims: expected [{n}], got {d:?}")));
    }
    Ok(words(dims).map(|v| v as usize).collect())
}

/// IEEE halves as little-endian bytes (a blob's `u8` tensor of them).
pub(super) fn halves_le(halves: &[u16]) -> Vec<u8> {
    halves.iter().flat_map(|h| h.to_le_bytes()).collect()
}

/// Read a `u8` tensor `name` of little-endian halves ([`halves_le`]); an odd
/// length is a serialization error (the values are checked by the weight).
pub(super) fn read_halves(r: &mut Reader<'_>, name: &str) -> Result<Vec<u16>> {
    let (_, bytes) = r.tensor(name, DType::U8)?;
    if bytes.len() % 2 != 0 {
        return Err(QuantError::ser(format!(
            "{name}: {} bytes, expected whole halves",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect())
}

/// `impl RowSource for $weight` through the weight's own `decode` and
/// `dot_row` (and, with `dot_rows`, its several-rows-per-pass dot).
macro_rules! row_source {
    ($weight:ty $(, $dot_rows:ident)?) => {
        impl $crate::linear::kernels::RowSource for $weight {
            fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
                <$weight>::decode(self, r, k0, out);
            }

            fn dot(&self, dots: $crate::linear::dispatch::Dots, r: usize, x: &[f32]) -> f32 {
                self.dot_row(dots, r, x)
            }

            $(
                fn $dot_rows(
                    &self,
                    dots: $crate::linear::dispatch::Dots,
                    r0: usize,
                    x: &[f32],
                    out: &mut [f32],
                ) {
                    <$weight>::$dot_rows(self, dots, r0, x, out);
                }
            )?
        }
    };
}
pub(super) use row_source;

/// Inside `impl WeightFormat`: `shape` and `dequantize` from the weight's
/// own methods of those names.
macro_rules! row_weight_basics {
    ($weight:ty) => {
        fn shape(w: &$weight) -> [usize; 2] {
            w.shape()
        }

        fn dequantize(w: &$weight) -> Vec<f32> {
            w.dequantize()
        }
    };
}
pub(super) use row_weight_basics;

/// The forward of 4-bit nibble-run rows (`w`'s codes `[out, in / 2]`)
/// by the AVX2 kernel that decodes the weights in registers
/// (`crate::int4_asym::batch_avx2`), where it applies: AVX2 in force, a
/// batch of `MIN_BATCH ..= MAX_BATCH` rows, no row of `x` that the engine
/// would have to scale (`crate::range`). Returns whether it ran; if not,
/// the caller runs the shared row engine.
#[cfg(target_arch = "x86_64")]
pub(super) fn batch_kernel<S>(
    w: &S,
    codes: &[u8],
    shape: [usize; 2],
    bias: Option<&[f32]>,
    x: &[f32],
    rows: usize,
    y: &mut [f32],
) -> bool
where
    S: crate::int4_asym::rows_avx2::GroupScales + Sync,
{
    use crate::int4_asym::batch_avx2::{matmul, MAX_BATCH, MIN_BATCH};
    use crate::linear::dispatch::Dots;
    let [n, k] = shape;
    let Dots::Avx2(t, f) = Dots::current() else {
        return false;
    };
    let fits = (MIN_BATCH..=MAX_BATCH).contains(&rows)
        && x.len() == rows * k
        && y.len() == rows * n
        && bias.is_none_or(|b| b.len() == n);
    if !fits || crate::range::shifts(x, k).is_some() {
        return false;
    }
    matmul(t, Dots::Avx2(t, f), w, codes, shape, x, bias, y);
    true
}

/// Elsewhere than x86-64 the shared row engine runs every batch.
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn batch_kernel<S>(
    _: &S,
    _: &[u8],
    _: [usize; 2],
    _: Option<&[f32]>,
    _: &[f32],
    _: usize,
    _: &mut [f32],
) -> bool {
    false
}

/// Inside `impl WeightFormat`: `matmul` by the AVX2 batch kernel where it
/// applies ([`batch_kernel`]), else, and `matmul_transposed` always, by the
/// shared row engine over the weight's `RowSource`, with no per-row scale
/// (the scales are inside the weight's dots and decodes).
macro_rules! row_engine_forward {
    ($weight:ty) => {
        fn matmul(
            w: &$weight,
            x: &[f32],
            rows: usize,
            bias: Option<&[f32]>,
            y: &mut [f32],
        ) -> $crate::error::Result<()> {
            if super::nibble_rows::batch_kernel(w, w.codes(), w.shape(), bias, x, rows, y) {
                return Ok(());
            }
            super::row_forward::forward_rows(w, w.shape(), &|_| 1.0, bias, x, rows, y)
        }

        fn matmul_transposed(
            w: &$weight,
            g: &[f32],
            rows: usize,
            dx: &mut [f32],
        ) -> $crate::error::Result<()> {
            $crate::linear::grad_input::grad_input_rows(w, w.shape(), &|_| 1.0, g, rows, dx)
        }
    };
}
pub(super) use row_engine_forward;
