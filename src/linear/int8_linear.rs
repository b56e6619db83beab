//! `Int8Linear`: int8 weights `[out, in]` with one symmetric absmax scale per
//! output row: `scale[o] = absmax(W[o]) / 127` (1.0 for an all-zero row),
//! `q = clamp(round_half_even(W / scale), -127, 127)`, `W ~ q * scale[o]`.
//! Forward: `y[b, o] = (x[b] . q[o]) * scale[o] + bias[o]`.

use rayon::prelude::*;

use super::dispatch::Dots;
use super::kernels::{matmul_rows, Epilogue, RowSource};
use super::serde::{self as ser, DType, Reader, Tag, Writer, FLAG_BIAS};
use super::stats::Stats;
use super::{check_bias, check_float_weight, rows_of, Device, QuantMethod, WeightDType};
use crate::error::{QuantError, Result};

/// int8 per-output-row linear layer.
#[derive(Clone, Debug)]
pub struct Int8Linear {
    q: Vec<i8>,
    scales: Vec<f32>,
    out_feat: usize,
    in_feat: usize,
    bias: Option<Vec<f32>>,
    merge_error: Option<f64>,
    stats: Stats,
}

struct Rows<'a> {
    q: &'a [i8],
    k: usize,
}

impl RowSource for Rows<'_> {
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

impl Int8Linear {
    /// From raw codes `[out, in]` and scales `[out]` (finite, > 0).
    pub fn new(
        q: Vec<i8>,
        scales: Vec<f32>,
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
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
        check_bias(bias.as_deref(), out_feat)?;
        Ok(Int8Linear {
            q,
            scales,
            out_feat,
            in_feat,
            bias,
            merge_error: None,
            stats: Stats::default(),
        })
    }

    /// Quantize a float weight `[out, in]` per output row.
    pub fn from_float(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        check_float_weight(w, &[out_feat, in_feat])?;
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
        Self::new(q, scales, out_feat, in_feat, bias)
    }

    /// The int8 codes `[out, in]`.
    pub fn q(&self) -> &[i8] {
        &self.q
    }
    /// The per-output-row scales `[out]`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// The same kind of layer (shape, bias) for `w`.
    fn rebuilt(&self, w: &[f32]) -> Result<Self> {
        Self::from_float(w, self.out_feat, self.in_feat, self.bias.clone())
    }

    fn write(&self, bias: Option<&[f32]>) -> Vec<u8> {
        let mut w = Writer::new(Tag::Int8, if bias.is_some() { FLAG_BIAS } else { 0 });
        let bytes: Vec<u8> = self.q.iter().map(|&v| v as u8).collect();
        w.tensor(DType::I8, &[self.out_feat, self.in_feat], &bytes);
        w.f32s(&[self.out_feat], &self.scales);
        if let Some(b) = bias {
            w.f32s(&[self.out_feat], b);
        }
        w.finish()
    }

    fn read(data: &[u8]) -> Result<(Self, Option<Vec<f32>>)> {
        let mut r = Reader::new(data, Tag::Int8)?;
        let (dims, bytes) = r.tensor("q", DType::I8)?;
        if dims.len() != 2 {
            return Err(QuantError::ser(format!(
                "q: expected rank 2, got dims {dims:?}"
            )));
        }
        let (_, scales) = r.f32s("scales")?;
        let bias = if r.flags & FLAG_BIAS != 0 {
            Some(r.f32s("bias")?.1)
        } else {
            None
        };
        r.finish()?;
        let q = bytes.iter().map(|&b| b as i8).collect();
        let layer = ser::as_ser(Self::new(q, scales, dims[0], dims[1], None))?;
        ser::as_ser(check_bias(bias.as_deref(), dims[0]))?;
        Ok((layer, bias))
    }
}

impl QuantMethod for Int8Linear {
    fn weight_shape(&self) -> Vec<usize> {
        vec![self.out_feat, self.in_feat]
    }

    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let rows = rows_of(x, y, self.in_feat, self.out_feat)?;
        self.stats.observe(x, self.in_feat);
        let src = Rows {
            q: &self.q,
            k: self.in_feat,
        };
        let scales = &self.scales;
        let epi = Epilogue {
            scale: &|r| scales[r],
            bias: self.bias.as_deref(),
        };
        matmul_rows(&src, self.out_feat, self.in_feat, x, rows, y, &epi);
        Ok(())
    }

    fn dequantize_w_vec(&self) -> Result<Vec<f32>> {
        let mut w = vec![0f32; self.q.len()];
        w.par_chunks_mut(self.in_feat)
            .zip(self.q.par_chunks(self.in_feat))
            .zip(self.scales.par_iter())
            .for_each(|((wr, qr), &s)| {
                for (o, &v) in wr.iter_mut().zip(qr) {
                    *o = v as f32 * s;
                }
            });
        Ok(w)
    }

    fn dtype_and_device(&self) -> (WeightDType, Device) {
        (WeightDType::I8, Device::Cpu)
    }

    shared_quant_method_items!(Int8, s => s.in_feat);
}

impl_quantized_serde!(Int8Linear, "int8-linear", s => s.out_feat);
