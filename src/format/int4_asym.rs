//! `int4_asym`: asymmetric INT4 (`crate::int4_asym`: per group of inputs
//! of one output row, codes `0..=15`, half step `d` and half minimum `m`,
//! `w = d * q + m`; group 32 is ggml Q4_1's math). Quantized here by min /
//! max (`WeightFormat::quantize`, what `apply_isq` and `QuantLinear` use);
//! the search quantizer is `AsymWeight::quantize` with `AsymMethod::Search`.
//!
//! The forward runs the shared row engine (`crate::linear::kernels`: rayon
//! over output rows, tiles decoded once per batch block for batches of 4
//! and more); its per-row dot for small batches is the fused kernel of
//! `crate::int4_asym` (`d * sum(q x) + m * sum(x)` per group, SIMD per level).

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::int4_asym::{groups_of, AsymMethod, AsymWeight};
use crate::linear::dispatch::Dots;
use crate::linear::grad_input::grad_input_rows;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{DType, Reader, Writer};

/// The asymmetric INT4 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4Asym;

impl RowSource for AsymWeight {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        // The engine's tiles start and end on multiples of 32 except at
        // `in`, itself a multiple of 32.
        AsymWeight::decode(self, r, k0, out);
    }

    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        self.dot_row(dots, r, x)
    }

    fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        AsymWeight::dot_rows(self, dots, r0, x, out);
    }
}

impl WeightFormat for Int4Asym {
    const INFO: FormatInfo = FormatInfo {
        name: "int4_asym",
        aliases: &["q4_asym", "int4-asym"],
        dtype_name: "int4_asym",
        serde_tag: 5,
        serde_name: "Int4Asym",
        layer_name: "int4-asym-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::None,
        int8_activations: false,
        gpu: None,
    };
    /// Inputs per group: a positive multiple of 32 (the last group of a row
    /// may be shorter).
    type Params = usize;
    type Weight = AsymWeight;
    type BlobParts = (Vec<usize>, Vec<u8>, Vec<u16>);

    /// One row: `in / 2` code bytes and 4 bytes per group.
    fn block(group_size: usize, in_feat: usize) -> Result<Block> {
        let groups = groups_of(1, in_feat, group_size)?;
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat / 2,
            scale_bytes: 4 * groups,
        })
    }

    fn params(w: &AsymWeight) -> usize {
        w.group_size()
    }

    fn shape(w: &AsymWeight) -> [usize; 2] {
        w.shape()
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, gs: usize) -> Result<AsymWeight> {
        AsymWeight::quantize(w, out_feat, in_feat, gs, AsymMethod::Rtn, None)
    }

    fn dequantize(w: &AsymWeight) -> Vec<f32> {
        w.dequantize()
    }

    fn matmul(
        w: &AsymWeight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        forward_rows(w, w.shape(), &|_| 1.0, bias, x, rows, y)
    }

    fn matmul_transposed(w: &AsymWeight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        grad_input_rows(w, w.shape(), &|_| 1.0, g, rows, dx)
    }

    fn write_blob(w: &AsymWeight, out: &mut Writer) {
        let [o, i] = w.shape();
        let dims: Vec<u8> = [o, i, w.group_size()]
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect();
        out.tensor(DType::U32, &[3], &dims);
        out.tensor(DType::U8, &[o, i / 2], w.codes());
        let halves: Vec<u8> = w.scales().iter().flat_map(|h| h.to_le_bytes()).collect();
        out.tensor(DType::U8, &[o, 4 * w.groups()], &halves);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (d, dims) = r.tensor("dims", DType::U32)?;
        if d != [3] {
            return Err(QuantError::ser(format!("dims: expected [3], got {d:?}")));
        }
        let dims: Vec<usize> = dims
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .collect();
        let (_, codes) = r.tensor("codes", DType::U8)?;
        let (_, halves) = r.tensor("scales", DType::U8)?;
        if halves.len() % 2 != 0 {
            return Err(QuantError::ser(format!(
                "scales: {} bytes, expected whole halves",
                halves.len()
            )));
        }
        let scales = halves
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok((dims, codes.to_vec(), scales))
    }

    fn from_blob((dims, codes, scales): Self::BlobParts) -> Result<AsymWeight> {
        AsymWeight::new(codes, scales, dims[0], dims[1], dims[2])
    }
}

#[cfg(test)]
#[path = "int4_asym_tests.rs"]
mod tests;
