//! `Int4Linear`: packed INT4 weights over [`QuantizedWeight`] (groups along
//! the input dimension; `QuantizedWeight` stores `[in, out]`, the transpose
//! of the linear's `[out, in]`). Forward: `y = x . W^T + bias` via
//! `QuantizedWeight::matmul`.
//!
//! Scales: absmax (`max(absmax / 7, 1e-8)`) by default. With an imatrix
//! `a` (`[in]`, the mean of `x_i^2`), each group's scale minimizes the
//! importance-weighted squared error `sum_i a_i (w_i - s q_i(s))^2`, with
//! `q_i(s) = clamp(round_half_even(w_i / s), -8, 7)`: a grid of candidates
//! `absmax / 7 * f` (`f` in `[0.70, 1.20]`, 51 steps, plus `absmax / 8`),
//! each followed by one least-squares refit `s = sum a w q / sum a q^2` for
//! its rounding (the llama.cpp `make_qx_quants` idea). The absmax scale is
//! a candidate, so the weighted error is never worse than absmax's.

use rayon::prelude::*;

use super::serde::{self as ser, DType, Reader, Tag, Writer, FLAG_BIAS};
use super::stats::Stats;
use super::{check_bias, check_float_weight, rows_of, Device, QuantMethod, WeightDType};
use crate::error::{QuantError, Result};
use crate::int4::{Layout, QuantizedWeight, MIN_SCALE};

/// INT4 linear layer.
#[derive(Clone, Debug)]
pub struct Int4Linear {
    qw: QuantizedWeight,
    bias: Option<Vec<f32>>,
    merge_error: Option<f64>,
    stats: Stats,
}

fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; w.len()];
    t.par_chunks_mut(rows).enumerate().for_each(|(c, tc)| {
        for (r, v) in tc.iter_mut().enumerate() {
            *v = w[r * cols + c];
        }
    });
    t
}

fn q_of(w: f32, s: f32) -> f32 {
    (w / s).round_ties_even().clamp(-8.0, 7.0)
}

/// Weighted squared error of scale `s` on `(w_i, a_i)`.
fn werr(ws: &[f32], a: &[f32], s: f32) -> f64 {
    ws.iter()
        .zip(a)
        .map(|(&w, &ai)| ai as f64 * (w as f64 - (s * q_of(w, s)) as f64).powi(2))
        .sum()
}

/// The importance-weighted scale of one group (see the module docs).
pub fn weighted_group_scale(ws: &[f32], a: &[f32]) -> f32 {
    let absmax = ws.iter().fold(0f32, |m, v| m.max(v.abs()));
    let base = (absmax / 7.0).max(MIN_SCALE);
    if absmax == 0.0 || a.iter().all(|&v| v == 0.0) {
        return base;
    }
    let (mut best, mut best_err) = (base, werr(ws, a, base));
    let mut consider = |s: f32| {
        if s.is_finite() && s >= MIN_SCALE {
            let e = werr(ws, a, s);
            if e < best_err {
                best = s;
                best_err = e;
            }
        }
    };
    let mut cands: Vec<f32> = (0..=50)
        .map(|i| absmax / 7.0 * (0.70 + 0.01 * i as f32))
        .collect();
    cands.push(absmax / 8.0);
    for s in cands {
        consider(s);
        let (mut num, mut den) = (0f64, 0f64);
        for (&w, &ai) in ws.iter().zip(a) {
            let q = q_of(w, s) as f64;
            num += ai as f64 * w as f64 * q;
            den += ai as f64 * q * q;
        }
        if den > 0.0 {
            consider((num / den) as f32);
        }
    }
    best
}

impl Int4Linear {
    /// Wrap a packed weight (`[in, out]` as `QuantizedWeight` stores it).
    pub fn new(qw: QuantizedWeight, bias: Option<Vec<f32>>) -> Result<Self> {
        check_bias(bias.as_deref(), qw.out_feat())?;
        Ok(Int4Linear {
            qw,
            bias,
            merge_error: None,
            stats: Stats::default(),
        })
    }

    /// Quantize a float weight `[out, in]`, groups of `group_size` along
    /// `in`; scales by absmax, or importance-weighted with `imatrix` `[in]`.
    pub fn from_float(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
        bias: Option<Vec<f32>>,
        imatrix: Option<&[f32]>,
    ) -> Result<Self> {
        check_float_weight(w, &[out_feat, in_feat])?;
        let wt = transpose(w, out_feat, in_feat); // [in, out]
        let qw = match imatrix {
            None => QuantizedWeight::quantize_grouped(&wt, in_feat, out_feat, group_size)?,
            Some(a) => {
                if a.len() != in_feat {
                    return Err(QuantError::dims("imatrix_weight", in_feat, a.len()));
                }
                let layout = Layout::new(in_feat, group_size)?;
                let gs = layout.group_size;
                // scales[g * out + o], computed per output row of `w`.
                let per_row: Vec<Vec<f32>> = w
                    .par_chunks(in_feat)
                    .map(|row| {
                        (0..layout.num_groups)
                            .map(|g| {
                                let r = g * gs..((g + 1) * gs).min(in_feat);
                                weighted_group_scale(&row[r.clone()], &a[r])
                            })
                            .collect()
                    })
                    .collect();
                let mut scales = vec![0f32; layout.num_groups * out_feat];
                for (o, row) in per_row.iter().enumerate() {
                    for (g, &s) in row.iter().enumerate() {
                        scales[g * out_feat + o] = s;
                    }
                }
                QuantizedWeight::quantize_with_scales(&wt, in_feat, out_feat, group_size, scales)?
            }
        };
        Self::new(qw, bias)
    }

    /// The packed INT4 weight (`[in, out]`, see `crate::int4`).
    pub fn qweight(&self) -> &QuantizedWeight {
        &self.qw
    }

    /// The same kind of layer (shape, group size, bias) for `w`.
    fn rebuilt(&self, w: &[f32]) -> Result<Self> {
        let (out, inf) = (self.qw.out_feat(), self.qw.in_feat());
        Self::from_float(w, out, inf, self.qw.group_size(), self.bias.clone(), None)
    }

    fn write(&self, bias: Option<&[f32]>) -> Vec<u8> {
        let q = &self.qw;
        let mut w = Writer::new(Tag::Int4, if bias.is_some() { FLAG_BIAS } else { 0 });
        let dims: Vec<u8> = [q.in_feat() as u32, q.out_feat() as u32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        w.tensor(DType::U32, &[2], &dims);
        w.tensor(DType::U8, &[q.data().len()], q.data());
        w.f32s(&[q.num_groups(), q.out_feat()], q.scales());
        if let Some(b) = bias {
            w.f32s(&[q.out_feat()], b);
        }
        w.finish()
    }

    fn read(data: &[u8]) -> Result<(Self, Option<Vec<f32>>)> {
        let mut r = Reader::new(data, Tag::Int4)?;
        let (d, dims) = r.tensor("dims", DType::U32)?;
        if d != [2] {
            return Err(QuantError::ser(format!("dims: expected [2], got {d:?}")));
        }
        let in_feat = u32::from_le_bytes(dims[0..4].try_into().expect("4 bytes")) as usize;
        let out_feat = u32::from_le_bytes(dims[4..8].try_into().expect("4 bytes")) as usize;
        let (_, packed) = r.tensor("data", DType::U8)?;
        let (sd, scales) = r.f32s("scales")?;
        if sd.len() != 2 || sd[1] != out_feat {
            return Err(QuantError::ser(format!(
                "scales dims {sd:?} do not match out_feat {out_feat}"
            )));
        }
        let bias = if r.flags & FLAG_BIAS != 0 {
            Some(r.f32s("bias")?.1)
        } else {
            None
        };
        r.finish()?;
        let qw = ser::as_ser(QuantizedWeight::from_parts(
            packed.to_vec(),
            scales,
            in_feat,
            out_feat,
            sd[0],
        ))?;
        ser::as_ser(check_bias(bias.as_deref(), out_feat))?;
        Ok((
            Int4Linear {
                qw,
                bias: None,
                merge_error: None,
                stats: Stats::default(),
            },
            bias,
        ))
    }
}

impl QuantMethod for Int4Linear {
    fn weight_shape(&self) -> Vec<usize> {
        vec![self.qw.out_feat(), self.qw.in_feat()]
    }

    fn forward_slice(&self, x: &[f32], y: &mut [f32]) -> Result<()> {
        let rows = rows_of(x, y, self.qw.in_feat(), self.qw.out_feat())?;
        self.stats.observe(x, self.qw.in_feat());
        self.qw.matmul(x, rows, y)?;
        if let Some(b) = &self.bias {
            for yr in y.chunks_exact_mut(b.len()) {
                for (v, &bb) in yr.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Ok(())
    }

    fn dequantize_w_vec(&self) -> Result<Vec<f32>> {
        Ok(transpose(
            &self.qw.dequantize(),
            self.qw.in_feat(),
            self.qw.out_feat(),
        ))
    }

    fn dtype_and_device(&self) -> (WeightDType, Device) {
        (WeightDType::I4, Device::Cpu)
    }

    shared_quant_method_items!(Int4, s => s.qw.in_feat());
}

impl_quantized_serde!(Int4Linear, "int4-linear", s => s.qw.out_feat());
