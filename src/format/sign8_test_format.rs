//! A test-only format that checks the claim of docs/architecture.md:
//! adding a format is this module plus one `registry!` line. Codes are
//! `sign(W)` as int8 `[out, in]` and one per-tensor scale, the mean of
//! `|W|`: `W ~ sign(W) * mean|W|`. Scalar only, no GPU kernels. Tests in
//! `crate::linear::registered` use it as an ordinary layer.

use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::linear::serde::{DType, Reader, Writer};

/// The sign format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sign8;

/// Sign codes `[out, in]` and a scale (finite, > 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Sign8Weight {
    codes: Vec<i8>,
    scale: f32,
    out_feat: usize,
    in_feat: usize,
}

impl Sign8Weight {
    fn new(codes: Vec<i8>, scale: f32, out_feat: usize, in_feat: usize) -> Result<Self> {
        if codes.len() != out_feat * in_feat || codes.iter().any(|c| c.abs() > 1) {
            return Err(QuantError::ser(
                "sign8 codes: expected out * in values in -1..=1",
            ));
        }
        if !(scale.is_finite() && scale > 0.0) {
            return Err(QuantError::ser(format!(
                "sign8 scale: expected > 0, got {scale}"
            )));
        }
        Ok(Sign8Weight {
            codes,
            scale,
            out_feat,
            in_feat,
        })
    }
}

impl WeightFormat for Sign8 {
    const INFO: FormatInfo = FormatInfo {
        name: "test_sign8",
        aliases: &[],
        dtype_name: "int8",
        serde_tag: 250,
        serde_name: "TestSign8",
        layer_name: "test-sign8-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::PerTensorF32,
        int8_activations: false,
        gpu: None,
    };
    type Params = ();
    type Weight = Sign8Weight;
    type BlobParts = (Vec<usize>, Vec<i8>, f32);

    fn block((): (), in_feat: usize) -> Result<Block> {
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat,
            scale_bytes: 0,
        })
    }

    fn params(_: &Sign8Weight) {}

    fn shape(w: &Sign8Weight) -> [usize; 2] {
        [w.out_feat, w.in_feat]
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<Sign8Weight> {
        let mean = w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len() as f64;
        let scale = if mean > 0.0 { mean as f32 } else { 1.0 };
        let codes = w
            .iter()
            .map(|&v| v.signum() as i8 * (v != 0.0) as i8)
            .collect();
        Sign8Weight::new(codes, scale, out_feat, in_feat)
    }

    fn dequantize(w: &Sign8Weight) -> Vec<f32> {
        w.codes.iter().map(|&c| c as f32 * w.scale).collect()
    }

    fn matmul(
        w: &Sign8Weight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let (out, k) = (w.out_feat, w.in_feat);
        for r in 0..rows {
            for o in 0..out {
                let dot: f32 = (0..k)
                    .map(|i| x[r * k + i] * w.codes[o * k + i] as f32)
                    .sum();
                y[r * out + o] = dot * w.scale + bias.map_or(0.0, |b| b[o]);
            }
        }
        Ok(())
    }

    fn write_blob(w: &Sign8Weight, out: &mut Writer) {
        let bytes: Vec<u8> = w.codes.iter().map(|&v| v as u8).collect();
        out.tensor(DType::I8, &[w.out_feat, w.in_feat], &bytes);
        out.f32s(&[1], &[w.scale]);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (dims, bytes) = r.tensor("codes", DType::I8)?;
        let (_, scale) = r.f32s("scale")?;
        if dims.len() != 2 || scale.len() != 1 {
            return Err(QuantError::ser(
                "sign8: expected codes [out, in] and scale [1]",
            ));
        }
        Ok((dims, bytes.iter().map(|&b| b as i8).collect(), scale[0]))
    }

    fn from_blob((dims, codes, scale): Self::BlobParts) -> Result<Sign8Weight> {
        Sign8Weight::new(codes, scale, dims[0], dims[1])
    }
}
