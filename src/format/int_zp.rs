//! `int_zp`: zero-point INT weights, the exact home of GPTQ and AWQ
//! checkpoints (`crate::int_zp`: per group of inputs of one output row,
//! 4- or 8-bit codes, a half scale `s` and an integer zero point `z`,
//! `w = s * (q - z)`, optionally an act-order input permutation).
//! Quantized here by min / max at 4 bits (`WeightFormat::quantize`, what
//! `apply_isq` and `QuantLinear` use; `Params` is the group size, so
//! re-quantizing an 8-bit weight, as `add_delta_w` does, gives 4-bit codes).
//!
//! The forward gathers `x` by the permutation once per call, then runs the
//! shared row engine (`crate::linear::kernels`) with the fused per-group
//! dot of `crate::int_zp` for small batches and tiles decoded once per
//! batch block for larger ones.

use super::nibble_rows::{
    batch_kernel, halves_le, read_dims, read_halves, row_source, row_weight_basics, words,
    write_dims,
};
use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::int_zp::{groups_of, quantize_rtn, ZpParts, ZpWeight};
use crate::linear::grad_input::grad_input_rows;
use crate::linear::serde::{DType, Reader, Writer};

/// The zero-point format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntZp;

row_source!(ZpWeight, dot_rows);

/// The fields of the blob's `dims` tensor: out, in, group size, bits,
/// whether a permutation follows.
const DIMS: usize = 5;

impl WeightFormat for IntZp {
    const INFO: FormatInfo = FormatInfo {
        name: "int_zp",
        aliases: &["gptq", "awq", "int-zp", "zp"],
        dtype_name: "int_zp",
        serde_tag: 6,
        serde_name: "IntZp",
        layer_name: "int-zp-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::None,
        int8_activations: false,
        gpu: None,
    };
    /// Inputs per group: a positive multiple of 32 (the last group of a row
    /// may be shorter).
    type Params = usize;
    type Weight = ZpWeight;
    type BlobParts = (Vec<usize>, Vec<u8>, Vec<u16>, Vec<u8>, Option<Vec<u32>>);

    /// One row at 4 bits: `in / 2` code bytes and 3 bytes per group.
    fn block(group_size: usize, in_feat: usize) -> Result<Block> {
        let groups = groups_of(1, in_feat, group_size, 4)?;
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat / 2,
            scale_bytes: 3 * groups,
        })
    }

    fn params(w: &ZpWeight) -> usize {
        w.group_size()
    }

    row_weight_basics!(ZpWeight);

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, gs: usize) -> Result<ZpWeight> {
        quantize_rtn(w, out_feat, in_feat, gs, 4)
    }

    fn matmul(
        w: &ZpWeight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let xs = w.gather(x);
        // 4-bit rows are the nibble runs of `int4_asym` with `(d, c) = (s,
        // -(s z))`: the same batch kernel serves them.
        if w.bits() == 4 && batch_kernel(w, w.codes(), w.shape(), bias, &xs, rows, y) {
            return Ok(());
        }
        forward_rows(w, w.shape(), &|_| 1.0, bias, &xs, rows, y)
    }

    fn matmul_transposed(w: &ZpWeight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        if w.perm().is_none() {
            return grad_input_rows(w, w.shape(), &|_| 1.0, g, rows, dx);
        }
        if rows.checked_mul(w.shape()[1]) != Some(dx.len()) {
            return Err(QuantError::dims(
                "dx",
                format!("[{rows}, {}]", w.shape()[1]),
                format!("{} elements", dx.len()),
            ));
        }
        let mut stored = vec![0f32; dx.len()];
        grad_input_rows(w, w.shape(), &|_| 1.0, g, rows, &mut stored)?;
        w.scatter(&stored, dx);
        Ok(())
    }

    fn write_blob(w: &ZpWeight, out: &mut Writer) {
        let [o, i] = w.shape();
        let has_perm = usize::from(w.perm().is_some());
        write_dims(out, &[o, i, w.group_size(), w.bits() as usize, has_perm]);
        out.tensor(DType::U8, &[w.codes().len()], w.codes());
        let halves = halves_le(w.scales());
        out.tensor(DType::U8, &[halves.len()], &halves);
        out.tensor(DType::U8, &[w.zeros().len()], w.zeros());
        let perm: Vec<u8> = w
            .perm()
            .unwrap_or(&[])
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        out.tensor(DType::U32, &[perm.len() / 4], &perm);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let dims = read_dims(r, DIMS)?;
        let (_, codes) = r.tensor("codes", DType::U8)?;
        let codes = codes.to_vec();
        let scales = read_halves(r, "scales")?;
        let (_, zeros) = r.tensor("zeros", DType::U8)?;
        let (_, perm) = r.tensor("perm", DType::U32)?;
        let perm = match dims[4] {
            0 if perm.is_empty() => None,
            1 => Some(words(perm).collect()),
            f => {
                return Err(QuantError::ser(format!(
                    "perm: flag {f} with {} entries, expected 0 with none or 1",
                    perm.len() / 4
                )))
            }
        };
        Ok((dims, codes, scales, zeros.to_vec(), perm))
    }

    fn from_blob((dims, codes, scales, zeros, perm): Self::BlobParts) -> Result<ZpWeight> {
        let parts = ZpParts {
            scales,
            zeros,
            perm,
            shape: [dims[0], dims[1]],
            group_size: dims[2],
            bits: u32::try_from(dims[3]).unwrap_or(0),
        };
        ZpWeight::new(codes, parts)
    }
}

#[cfg(test)]
#[path = "int_zp_tests.rs"]
mod tests;
