//! `UnquantLinear`: a plain float32 linear, `y = x . W^T + bias`, the
//! `apply_isq(None)` target.

use super::dispatch::Dots;
use super::kernels::{matmul_rows, Epilogue, RowSource};
use super::serde::{self as ser, Reader, Tag, Writer, FLAG_BIAS};
use super::stats::Stats;
use super::{check_bias, check_float_weight, rows_of, Device, QuantMethod, WeightDType};
use crate::error::{QuantError, Result};

/// Float32 linear layer, weight `[out, in]`.
#[derive(Clone, Debug)]
pub struct UnquantLinear {
    weight: Vec<f32>,
    out_feat: usize,
    in_feat: usize,
    bias: Option<Vec<f32>>,
    merge_error: Option<f64>,
    stats: Stats,
}

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

impl UnquantLinear {
    /// Validated: finite weight of `out * in` elements, bias `[out]`.
    pub fn new(
        weight: Vec<f32>,
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_float_weight(&weight, &[out_feat, in_feat])?;
        check_bias(bias.as_deref(), out_feat)?;
        Ok(UnquantLinear {
            weight,
            out_feat,
            in_feat,
            bias,
            merge_error: None,
            stats: Stats::default(),
        })
    }

    /// The f32 weight `[out, in]`.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    /// The same kind of layer (shape, bias) for `w`.
    fn rebuilt(&self, w: &[f32]) -> Result<Self> {
        Self::new(w.to_vec(), self.out_feat, self.in_feat, self.bias.clone())
    }

    fn write(&self, bias: Option<&[f32]>) -> Vec<u8> {
        let mut w = Writer::new(Tag::Unquant, if bias.is_some() { FLAG_BIAS } else { 0 });
        w.f32s(&[self.out_feat, self.in_feat], &self.weight);
        if let Some(b) = bias {
            w.f32s(&[self.out_feat], b);
        }
        w.finish()
    }

    fn read(data: &[u8]) -> Result<(Self, Option<Vec<f32>>)> {
        let mut r = Reader::new(data, Tag::Unquant)?;
        let (dims, w) = r.f32s("weight")?;
        if dims.len() != 2 {
            return Err(QuantError::ser(format!(
                "weight: expected rank 2, got dims {dims:?}"
            )));
        }
        let bias = if r.flags & FLAG_BIAS != 0 {
            Some(r.f32s("bias")?.1)
        } else {
            None
        };
        r.finish()?;
        let layer = ser::as_ser(Self::new(w, dims[0], dims[1], None))?;
        ser::as_ser(check_bias(bias.as_deref(), dims[0]))?;
        Ok((layer, bias))
    }
}

impl QuantMethod for UnquantLinear {
    fn weight_shape(&self) -> Vec<usize> {
        vec![self.out_feat, self.in_feat]
    }

    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let rows = rows_of(x, y, self.in_feat, self.out_feat)?;
        self.stats.observe(x, self.in_feat);
        let src = Rows {
            w: &self.weight,
            k: self.in_feat,
        };
        let epi = Epilogue {
            scale: &|_| 1.0,
            bias: self.bias.as_deref(),
        };
        matmul_rows(&src, self.out_feat, self.in_feat, x, rows, y, &epi);
        Ok(())
    }

    fn dequantize_w_vec(&self) -> Result<Vec<f32>> {
        Ok(self.weight.clone())
    }

    fn dtype_and_device(&self) -> (WeightDType, Device) {
        (WeightDType::F32, Device::Cpu)
    }

    shared_quant_method_items!(Unquant, s => s.in_feat);
}

impl_quantized_serde!(UnquantLinear, "unquant-linear", s => s.out_feat);
