//! `int4_k`: k-quant-style INT4 (`crate::int4_k`: per group of 32 inputs of
//! one output row, codes `0..=15` with 6-bit step and minimum codes under a
//! half pair `(D, Dmin)` per super-block, `w = (D sc) q - Dmin mn`, llama.cpp
//! Q4_K's arithmetic). Quantized here by `KMethod::Rtn`
//! (`WeightFormat::quantize`, what `apply_isq` and `QuantLinear` use); the
//! search is `KWeight::quantize` with `KMethod::Search`.
//!
//! The forward runs the shared row engine (`crate::linear::kernels`); its
//! per-row dot for small batches is the fused kernel of `crate::int4_k`.

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::int4_k::{groups_of, scale_code_bytes, super_block, KMethod, KWeight};
use crate::linear::dispatch::Dots;
use crate::linear::grad_input::grad_input_rows;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{DType, Reader, Writer};

/// The k-quant-style INT4 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4K;

impl RowSource for KWeight {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        KWeight::decode(self, r, k0, out);
    }

    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        self.dot_row(dots, r, x)
    }

    fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        KWeight::dot_rows(self, dots, r0, x, out);
    }
}

impl WeightFormat for Int4K {
    const INFO: FormatInfo = FormatInfo {
        name: "int4_k",
        aliases: &["int4-k", "q4_k_rows"],
        dtype_name: "int4_k",
        serde_tag: 7,
        serde_name: "Int4K",
        layer_name: "int4-k-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::None,
        int8_activations: false,
        gpu: None,
    };
    type Params = ();
    type Weight = KWeight;
    type BlobParts = (Vec<usize>, Vec<u8>, Vec<u8>, Vec<u16>);

    /// One row: `in / 2` code bytes, the packed 6-bit codes and 4 bytes per
    /// super-block.
    fn block((): (), in_feat: usize) -> Result<Block> {
        let groups = groups_of(1, in_feat)?;
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat / 2,
            scale_bytes: scale_code_bytes(groups) + 4 * (in_feat / super_block(in_feat)),
        })
    }

    fn params(_: &KWeight) {}

    fn shape(w: &KWeight) -> [usize; 2] {
        w.shape()
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<KWeight> {
        KWeight::quantize(w, out_feat, in_feat, KMethod::Rtn, None)
    }

    fn dequantize(w: &KWeight) -> Vec<f32> {
        w.dequantize()
    }

    fn matmul(
        w: &KWeight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        forward_rows(w, w.shape(), &|_| 1.0, bias, x, rows, y)
    }

    fn matmul_transposed(w: &KWeight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        grad_input_rows(w, w.shape(), &|_| 1.0, g, rows, dx)
    }

    fn write_blob(w: &KWeight, out: &mut Writer) {
        let [o, i] = w.shape();
        let dims: Vec<u8> = [o, i]
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect();
        out.tensor(DType::U32, &[2], &dims);
        out.tensor(DType::U8, &[o, i / 2], w.codes());
        out.tensor(
            DType::U8,
            &[o, scale_code_bytes(w.groups())],
            w.scale_codes(),
        );
        let halves: Vec<u8> = w.supers().iter().flat_map(|h| h.to_le_bytes()).collect();
        out.tensor(DType::U8, &[o, 4 * w.supers_per_row()], &halves);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (d, dims) = r.tensor("dims", DType::U32)?;
        if d != [2] {
            return Err(QuantError::ser(format!("dims: expected [2], got {d:?}")));
        }
        let dims: Vec<usize> = dims
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .collect();
        let (_, codes) = r.tensor("codes", DType::U8)?;
        let (_, scale_codes) = r.tensor("scale_codes", DType::U8)?;
        let (_, halves) = r.tensor("supers", DType::U8)?;
        if halves.len() % 2 != 0 {
            return Err(QuantError::ser(format!(
                "supers: {} bytes, expected whole halves",
                halves.len()
            )));
        }
        let supers = halves
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok((dims, codes.to_vec(), scale_codes.to_vec(), supers))
    }

    fn from_blob((dims, codes, scale_codes, supers): Self::BlobParts) -> Result<KWeight> {
        // Errors become `SerializationError`s at the caller (`ser::as_ser`).
        KWeight::new(codes, scale_codes, supers, dims[0], dims[1])
    }
}
