//! `int4_k`: k-quant-style INT4 (`crate::int4_k`: per group of 32 inputs of
//! one output row, codes `0..=15` with 6-bit step and minimum codes under a
//! half pair `(D, Dmin)` per super-block, `w = (D sc) q - Dmin mn`, llama.cpp
//! Q4_K's arithmetic). Quantized here by `KMethod::Rtn`
//! (`WeightFormat::quantize`, what `apply_isq` and `QuantLinear` use); the
//! search is `KWeight::quantize` with `KMethod::Search`.
//!
//! The forward runs the shared row engine (`crate::linear::kernels`); its
//! per-row dot for small batches is the fused kernel of `crate::int4_k`.

use super::nibble_rows::{
    halves_le, read_dims, read_halves, row_engine_forward, row_source, row_weight_basics,
    write_dims,
};
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::Result;
use crate::int4_k::{groups_of, scale_code_bytes, super_block, KMethod, KWeight};
use crate::linear::serde::{DType, Reader, Writer};

/// The k-quant-style INT4 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4K;

row_source!(KWeight, dot_rows);

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

    row_weight_basics!(KWeight);
    row_engine_forward!(KWeight);

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<KWeight> {
        KWeight::quantize(w, out_feat, in_feat, KMethod::Rtn, None)
    }

    fn write_blob(w: &KWeight, out: &mut Writer) {
        let [o, i] = w.shape();
        write_dims(out, &[o, i]);
        out.tensor(DType::U8, &[o, i / 2], w.codes());
        out.tensor(
            DType::U8,
            &[o, scale_code_bytes(w.groups())],
            w.scale_codes(),
        );
        out.tensor(
            DType::U8,
            &[o, 4 * w.supers_per_row()],
            &halves_le(w.supers()),
        );
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let dims = read_dims(r, 2)?;
        let (_, codes) = r.tensor("codes", DType::U8)?;
        let codes = codes.to_vec();
        let (_, scale_codes) = r.tensor("scale_codes", DType::U8)?;
        let scale_codes = scale_codes.to_vec();
        Ok((dims, codes, scale_codes, read_halves(r, "supers")?))
    }

    fn from_blob((dims, codes, scale_codes, supers): Self::BlobParts) -> Result<KWeight> {
        // Errors become `SerializationError`s at the caller (`ser::as_ser`).
        KWeight::new(codes, scale_codes, supers, dims[0], dims[1])
    }
}
