//! FP8 E4M3 codes, one byte per weight, with one per-tensor dequantization
//! multiplier `scale` (`W = decode(codes) * scale`): quantization maps the
//! tensor's absmax onto the largest finite E4M3 value (448).
//!
//! The layer over it, `crate::linear::PerTensorFP8Linear`, is a family of
//! its own (expert-stacked `[E, out, in]` weights, a static activation
//! scale for W8A8); it calls the functions here for its codes.

use rayon::prelude::*;

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, GpuKernels, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::fp8::{decode_slice, encode_slice, Fp8Format};
use crate::linear::dispatch::Dots;
use crate::linear::grad_input::grad_input_rows;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{DType, Reader, Writer};

const FMT: Fp8Format = Fp8Format::E4M3;

/// The per-tensor FP8 E4M3 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fp8E4M3;

/// An E4M3 weight `[out, in]` with its per-tensor multiplier.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Weight {
    codes: Vec<u8>,
    out_feat: usize,
    in_feat: usize,
    scale: f32,
}

impl Fp8Weight {
    /// Validated: `out * in` codes, none a NaN code (0x7F, 0xFF), `scale`
    /// finite and > 0.
    pub fn new(codes: Vec<u8>, out_feat: usize, in_feat: usize, scale: f32) -> Result<Self> {
        if out_feat == 0 || in_feat == 0 {
            return Err(QuantError::arg(format!(
                "weight shape [{out_feat}, {in_feat}] is empty"
            )));
        }
        if Some(codes.len()) != out_feat.checked_mul(in_feat) {
            return Err(QuantError::dims(
                "weight length",
                format!("{out_feat} x {in_feat}"),
                codes.len(),
            ));
        }
        check_scale("weight_scale_inv", scale)?;
        check_codes(&codes)?;
        // A batch-1 forward streams the codes from DRAM on every call, as
        // the per-tensor FP8 layer's (see `crate::hugepages`).
        crate::hugepages::advise(&codes);
        Ok(Fp8Weight {
            codes,
            out_feat,
            in_feat,
            scale,
        })
    }

    /// The E4M3 codes `[out, in]`.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }

    /// The per-tensor multiplier.
    pub fn scale(&self) -> f32 {
        self.scale
    }
}

/// A per-tensor scale must be finite and > 0.
pub(crate) fn check_scale(name: &str, s: f32) -> Result<()> {
    if !(s.is_finite() && s > 0.0) {
        return Err(QuantError::arg(format!(
            "{name}: expected finite and > 0, got {s}"
        )));
    }
    Ok(())
}

/// No NaN code (0x7F, 0xFF) among `codes`.
pub(crate) fn check_codes(codes: &[u8]) -> Result<()> {
    if let Some(i) = codes.iter().position(|&c| c & 0x7F == 0x7F) {
        return Err(QuantError::arg(format!(
            "weight[{i}] is the E4M3 NaN code {:#04x}",
            codes[i]
        )));
    }
    Ok(())
}

/// Quantize finite `w` (any shape): `scale = absmax / 448` (1.0 for an
/// all-zero tensor), codes `encode(w / scale, saturate=True)`.
pub(crate) fn quantize_e4m3(w: &[f32]) -> (Vec<u8>, f32) {
    let absmax = w
        .par_iter()
        .with_min_len(1 << 14)
        .map(|v| v.abs())
        .reduce(|| 0.0, f32::max);
    let scale = if absmax > 0.0 {
        absmax / FMT.max_value()
    } else {
        1.0
    };
    let mut codes = vec![0u8; w.len()];
    codes
        .par_chunks_mut(1 << 14)
        .zip(w.par_chunks(1 << 14))
        .for_each(|(c, wc)| {
            let scaled: Vec<f32> = wc.iter().map(|v| v / scale).collect();
            encode_slice(&scaled, c, FMT, true);
        });
    (codes, scale)
}

/// `decode(codes) * scale`.
pub(crate) fn dequantize_e4m3(codes: &[u8], scale: f32) -> Vec<f32> {
    let mut w = vec![0f32; codes.len()];
    decode_slice(codes, &mut w, FMT);
    w.par_iter_mut()
        .with_min_len(1 << 14)
        .for_each(|v| *v *= scale);
    w
}

/// E4M3 rows of `k` codes for the shared forward engine.
pub(crate) struct E4m3Rows<'a> {
    /// The codes `[n, k]`.
    pub codes: &'a [u8],
    /// Codes per row.
    pub k: usize,
}

impl RowSource for E4m3Rows<'_> {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        let s = r * self.k + k0;
        // A tile row (< 128 Ki codes): decoded on this thread.
        decode_slice(&self.codes[s..s + out.len()], out, FMT);
    }
    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        dots.e4m3(&self.codes[r * self.k..(r + 1) * self.k], x)
    }
    fn e4m3_codes(&self) -> Option<&[u8]> {
        Some(self.codes)
    }
}

impl WeightFormat for Fp8E4M3 {
    const INFO: FormatInfo = FormatInfo {
        name: "fp8_e4m3",
        aliases: &["fp8", "e4m3", "float8_e4m3fn"],
        dtype_name: "float8_e4m3fn",
        serde_tag: 1,
        serde_name: "Fp8",
        layer_name: "pertensor-fp8-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::PerTensorF32,
        int8_activations: false,
        gpu: Some(GpuKernels {
            source: "linear",
            kernels: &["linear_fp8_dot", "linear_fp8_gemm"],
        }),
    };
    type Params = ();
    type Weight = Fp8Weight;
    type BlobParts = (Vec<usize>, Vec<u8>, f32);

    fn block((): (), in_feat: usize) -> Result<Block> {
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat,
            scale_bytes: 0,
        })
    }

    fn params(_: &Fp8Weight) {}

    fn shape(w: &Fp8Weight) -> [usize; 2] {
        [w.out_feat, w.in_feat]
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<Fp8Weight> {
        let (codes, scale) = quantize_e4m3(w);
        Fp8Weight::new(codes, out_feat, in_feat, scale)
    }

    fn dequantize(w: &Fp8Weight) -> Vec<f32> {
        dequantize_e4m3(&w.codes, w.scale)
    }

    /// Weight-only (W8A32): `y = (x . decode(codes)^T) * scale + bias`.
    fn matmul(
        w: &Fp8Weight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let src = E4m3Rows {
            codes: &w.codes,
            k: w.in_feat,
        };
        let scale = w.scale;
        forward_rows(&src, Self::shape(w), &|_| scale, bias, x, rows, y)
    }

    fn matmul_transposed(w: &Fp8Weight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        let src = E4m3Rows {
            codes: &w.codes,
            k: w.in_feat,
        };
        let scale = w.scale;
        grad_input_rows(&src, Self::shape(w), &|_| scale, g, rows, dx)
    }

    fn write_blob(w: &Fp8Weight, out: &mut Writer) {
        out.tensor(DType::F8E4M3, &[w.out_feat, w.in_feat], &w.codes);
        out.f32s(&[], &[w.scale]);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (shape, codes) = r.tensor("weight", DType::F8E4M3)?;
        let scale = r.scalar("weight_scale_inv")?;
        if shape.len() != 2 {
            return Err(QuantError::ser(format!(
                "weight: expected rank 2, got dims {shape:?}"
            )));
        }
        Ok((shape, codes.to_vec(), scale))
    }

    fn from_blob((shape, codes, scale): Self::BlobParts) -> Result<Fp8Weight> {
        Fp8Weight::new(codes, shape[0], shape[1], scale)
    }
}
