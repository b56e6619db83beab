//! int8 weights `[out, in]` with one symmetric absmax scale per output row:
//! `scale[o] = absmax(W[o]) / 127` (1.0 for an all-zero row),
//! `q = clamp(round_half_even(W / scale), -127, 127)`, `W ~ q * scale[o]`.
//! Forward: `y[b, o] = (x[b] . q[o]) * scale[o] + bias[o]`.

use rayon::prelude::*;

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, GpuKernels, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::linear::dispatch::Dots;
use crate::linear::grad_input::grad_input_rows;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{DType, Reader, Writer};

/// The per-row int8 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int8;

/// An int8 weight: codes `[out, in]` and scales `[out]` (finite, > 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Weight {
    q: Vec<i8>,
    scales: Vec<f32>,
    out_feat: usize,
    in_feat: usize,
}

impl Int8Weight {
    /// From raw codes `[out, in]` and scales `[out]` (finite, > 0).
    pub fn new(q: Vec<i8>, scales: Vec<f32>, out_feat: usize, in_feat: usize) -> Result<Self> {
        if out_feat == 0 || in_feat == 0 {
            return Err(QuantError::arg(format!(
                "weight shape [{out_feat}, {in_feat}] is empty"
            )));
        }
        if Some(q.len()) != out_feat.checked_mul(in_feat) {
            return Err(QuantError::dims(
                "q length",
                format!("{out_feat} x {in_feat}"),
                q.len(),
            ));
        }
        if scales.len() != out_feat {
            return Err(QuantError::dims(
                "scales",
                format!("[{out_feat}]"),
                format!("[{}]", scales.len()),
            ));
        }
        if let Some(i) = scales.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
            return Err(QuantError::arg(format!(
                "scales[{i}]: expected finite and > 0, got {}",
                scales[i]
            )));
        }
        Ok(Int8Weight {
            q,
            scales,
            out_feat,
            in_feat,
        })
    }

    /// The codes `[out, in]`.
    pub fn q(&self) -> &[i8] {
        &self.q
    }

    /// The per-output-row scales `[out]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
}

/// Rows `[out, k]` of int8 codes for the shared forward engine.
pub(crate) struct Int8Rows<'a> {
    /// The codes `[out, k]`.
    pub q: &'a [i8],
    /// Codes per row.
    pub k: usize,
}

impl RowSource for Int8Rows<'_> {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        let s = r * self.k + k0;
        let src = &self.q[s..s + out.len()];
        for (o, &v) in out.iter_mut().zip(src) {
            *o = v as f32;
        }
    }
    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        dots.i8(&self.q[r * self.k..(r + 1) * self.k], x)
    }
}

impl WeightFormat for Int8 {
    const INFO: FormatInfo = FormatInfo {
        name: "int8",
        aliases: &["q8"],
        dtype_name: "int8",
        serde_tag: 3,
        serde_name: "Int8",
        layer_name: "int8-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::PerRowF32,
        int8_activations: false,
        gpu: Some(GpuKernels {
            source: "linear",
            kernels: &["linear_i8_dot", "linear_i8_gemm"],
        }),
    };
    type Params = ();
    type Weight = Int8Weight;
    type BlobParts = (Vec<usize>, Vec<i8>, Vec<f32>);

    fn block((): (), in_feat: usize) -> Result<Block> {
        Ok(Block {
            elems: in_feat,
            code_bytes: in_feat,
            scale_bytes: 4,
        })
    }

    fn params(_: &Int8Weight) {}

    fn shape(w: &Int8Weight) -> [usize; 2] {
        [w.out_feat, w.in_feat]
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<Int8Weight> {
        let mut q = vec![0i8; w.len()];
        let scales: Vec<f32> = q
            .par_chunks_mut(in_feat)
            .zip(w.par_chunks(in_feat))
            .map(|(qr, wr)| {
                let absmax = wr.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = if absmax > 0.0 { absmax / 127.0 } else { 1.0 };
                for (o, &v) in qr.iter_mut().zip(wr) {
                    *o = (v / s).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
                s
            })
            .collect();
        Int8Weight::new(q, scales, out_feat, in_feat)
    }

    fn dequantize(w: &Int8Weight) -> Vec<f32> {
        let mut out = vec![0f32; w.q.len()];
        out.par_chunks_mut(w.in_feat)
            .zip(w.q.par_chunks(w.in_feat))
            .zip(w.scales.par_iter())
            .for_each(|((wr, qr), &s)| {
                for (o, &v) in wr.iter_mut().zip(qr) {
                    *o = v as f32 * s;
                }
            });
        out
    }

    fn matmul(
        w: &Int8Weight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let src = Int8Rows {
            q: &w.q,
            k: w.in_feat,
        };
        let scales = &w.scales;
        forward_rows(&src, Self::shape(w), &|r| scales[r], bias, x, rows, y)
    }

    fn matmul_transposed(w: &Int8Weight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        let src = Int8Rows {
            q: &w.q,
            k: w.in_feat,
        };
        let scales = &w.scales;
        grad_input_rows(&src, Self::shape(w), &|r| scales[r], g, rows, dx)
    }

    fn write_blob(w: &Int8Weight, out: &mut Writer) {
        let bytes: Vec<u8> = w.q.iter().map(|&v| v as u8).collect();
        out.tensor(DType::I8, &[w.out_feat, w.in_feat], &bytes);
        out.f32s(&[w.out_feat], &w.scales);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (dims, bytes) = r.tensor("q", DType::I8)?;
        if dims.len() != 2 {
            return Err(QuantError::ser(format!(
                "q: expected rank 2, got dims {dims:?}"
            )));
        }
        let (_, scales) = r.f32s("scales")?;
        Ok((dims, bytes.iter().map(|&b| b as i8).collect(), scales))
    }

    fn from_blob((dims, q, scales): Self::BlobParts) -> Result<Int8Weight> {
        Int8Weight::new(q, scales, dims[0], dims[1])
    }
}
