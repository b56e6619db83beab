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

use super::nibble_rows::{
    halves_le, read_dims, read_halves, row_engine_forward, row_source, row_weight_basics,
    write_dims,
};
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::Result;
use crate::int4_asym::{groups_of, AsymMethod, AsymWeight};
use crate::linear::serde::{DType, Reader, Writer};

/// The asymmetric INT4 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4Asym;

// The engine's tiles start and end on multiples of 32 except at `in`,
// itself a multiple of 32, so `decode` sees whole runs.
row_source!(AsymWeight, dot_rows);

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

    row_weight_basics!(AsymWeight);
    row_engine_forward!(AsymWeight);

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, gs: usize) -> Result<AsymWeight> {
        AsymWeight::quantize(w, out_feat, in_feat, gs, AsymMethod::Rtn, None)
    }

    fn write_blob(w: &AsymWeight, out: &mut Writer) {
        let [o, i] = w.shape();
        write_dims(out, &[o, i, w.group_size()]);
        out.tensor(DType::U8, &[o, i / 2], w.codes());
        out.tensor(DType::U8, &[o, 4 * w.groups()], &halves_le(w.scales()));
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let dims = read_dims(r, 3)?;
        let (_, codes) = r.tensor("codes", DType::U8)?;
        let codes = codes.to_vec();
        Ok((dims, codes, read_halves(r, "scales")?))
    }

    fn from_blob((dims, codes, scales): Self::BlobParts) -> Result<AsymWeight> {
        AsymWeight::new(codes, scales, dims[0], dims[1], dims[2])
    }
}

#[cfg(test)]
#[path = "int4_asym_tests.rs"]
mod tests;
