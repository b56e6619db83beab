//! float32, unquantized: the weight `[out, in]` as it is. The
//! `apply_isq(None)` target, registered like any other format so that the
//! one generic layer serves it too.

use super::row_forward::forward_rows;
use super::weight_format::{Block, FormatInfo, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::linear::dispatch::Dots;
use crate::linear::grad_input::grad_input_rows;
use crate::linear::kernels::RowSource;
use crate::linear::serde::{Reader, Writer};

/// The float32 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Float32;

/// A float32 weight `[out, in]`, finite.
#[derive(Clone, Debug, PartialEq)]
pub struct FloatWeight {
    w: Vec<f32>,
    out_feat: usize,
    in_feat: usize,
}

impl FloatWeight {
    /// Validated: finite, `out * in` elements, neither dimension 0.
    pub fn new(w: Vec<f32>, out_feat: usize, in_feat: usize) -> Result<Self> {
        check_float_weight(&w, &[out_feat, in_feat])?;
        Ok(FloatWeight {
            w,
            out_feat,
            in_feat,
        })
    }

    /// The values `[out, in]`.
    pub fn values(&self) -> &[f32] {
        &self.w
    }
}

/// Validate a float weight: shape product and finiteness (first bad index).
pub(crate) fn check_float_weight(w: &[f32], shape: &[usize]) -> Result<()> {
    if shape.contains(&0) {
        return Err(QuantError::arg(format!("weight shape {shape:?} is empty")));
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| QuantError::arg(format!("weight shape {shape:?} overflows")))?;
    if w.len() != n {
        return Err(QuantError::dims("weight length", n, w.len()));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::arg(format!(
            "weight[{i}] is not finite ({})",
            w[i]
        )));
    }
    Ok(())
}

/// Rows `[out, k]` of f32 values for the shared forward engine.
struct Rows<'a> {
    w: &'a [f32],
    k: usize,
}

impl RowSource for Rows<'_> {
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
        let s = r * self.k + k0;
        out.copy_from_slice(&self.w[s..s + out.len()]);
    }
    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
        dots.f32(&self.w[r * self.k..(r + 1) * self.k], x)
    }
}

impl WeightFormat for Float32 {
    const INFO: FormatInfo = FormatInfo {
        name: "float32",
        aliases: &["f32", "fp32"],
        dtype_name: "float32",
        serde_tag: 2,
        serde_name: "Unquant",
        layer_name: "unquant-linear",
        safetensors_format: None,
        order: RowOrder::OutputMajor,
        scales: ScaleStorage::None,
        int8_activations: false,
        gpu: Some(super::GpuKernels {
            source: "linear",
            kernels: &["linear_f32_dot", "linear_f32_gemm"],
        }),
    };
    type Params = ();
    type Weight = FloatWeight;
    type BlobParts = (Vec<usize>, Vec<f32>);

    fn block((): (), _in_feat: usize) -> Result<Block> {
        Ok(Block {
            elems: 1,
            code_bytes: 4,
            scale_bytes: 0,
        })
    }

    fn params(_: &FloatWeight) {}

    fn shape(w: &FloatWeight) -> [usize; 2] {
        [w.out_feat, w.in_feat]
    }

    fn quantize(w: &[f32], out_feat: usize, in_feat: usize, (): ()) -> Result<FloatWeight> {
        FloatWeight::new(w.to_vec(), out_feat, in_feat)
    }

    fn dequantize(w: &FloatWeight) -> Vec<f32> {
        w.w.clone()
    }

    fn matmul(
        w: &FloatWeight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        let src = Rows {
            w: &w.w,
            k: w.in_feat,
        };
        forward_rows(&src, Self::shape(w), &|_| 1.0, bias, x, rows, y)
    }

    fn matmul_transposed(w: &FloatWeight, g: &[f32], rows: usize, dx: &mut [f32]) -> Result<()> {
        let src = Rows {
            w: &w.w,
            k: w.in_feat,
        };
        grad_input_rows(&src, Self::shape(w), &|_| 1.0, g, rows, dx)
    }

    fn write_blob(w: &FloatWeight, out: &mut Writer) {
        out.f32s(&[w.out_feat, w.in_feat], &w.w);
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
        let (dims, w) = r.f32s("weight")?;
        if dims.len() != 2 {
            return Err(QuantError::ser(format!(
                "weight: expected rank 2, got dims {dims:?}"
            )));
        }
        Ok((dims, w))
    }

    fn from_blob((dims, w): Self::BlobParts) -> Result<FloatWeight> {
        FloatWeight::new(w, dims[0], dims[1])
    }
}
