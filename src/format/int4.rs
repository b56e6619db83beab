//! Packed symmetric INT4 (`crate::int4::QuantizedWeight`): codes in
//! nibble pairs `[in / 2, out]`, f32 scales `[groups, out]` per group of
//! `group_size` input rows (any even size); the kernels are `crate::int4`'s,
//! with an int8-activation path.
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

use super::weight_format::{Block, FormatInfo, GpuKernels, RowOrder, ScaleStorage, WeightFormat};
use crate::error::{QuantError, Result};
use crate::int4::{Activations, Layout, QuantizedWeight, MIN_SCALE};
use crate::linear::serde::{DType, Reader, Writer};

/// The INT4 format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Int4;

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

/// Quantize `w` `[out, in]` in groups of `group_size` inputs, each group's
/// scale chosen by [`weighted_group_scale`] with the importances `imatrix`
/// `[in]` (the mean of `x_i^2`).
pub fn quantize_weighted(
    w: &[f32],
    out_feat: usize,
    in_feat: usize,
    group_size: usize,
    imatrix: &[f32],
) -> Result<QuantizedWeight> {
    if imatrix.len() != in_feat {
        return Err(QuantError::dims("imatrix_weight", in_feat, imatrix.len()));
    }
    let wt = transpose(w, out_feat, in_feat); // [in, out]
    let layout = Layout::new(in_feat, group_size)?;
    let gs = layout.group_size;
    // scales[g * out + o], computed per output row of `w`.
    let per_row: Vec<Vec<f32>> = w
        .par_chunks(in_feat)
        .map(|row| {
            (0..layout.num_groups)
                .map(|g| {
                    let r = g * gs..((g + 1) * gs).min(in_feat);
                    weighted_group_scale(&row[r.clone()], &imatrix[r])
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
    QuantizedWeight::quantize_with_scales(&wt, in_feat, out_feat, group_size, scales)
}

/// Add `bias` `[out]` to every row of `y`.
fn add_bias(y: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for yr in y.chunks_exact_mut(b.len()) {
            for (v, &bb) in yr.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

impl WeightFormat for Int4 {
    const INFO: FormatInfo = FormatInfo {
        name: "int4",
        aliases: &["q4"],
        dtype_name: "int4",
        serde_tag: 4,
        serde_name: "Int4",
        layer_name: "int4-linear",
        safetensors_format: Some("quantrs.int4"),
        order: RowOrder::InputMajorNibblePairs,
        scales: ScaleStorage::PerGroupF32,
        int8_activations: true,
        gpu: Some(GpuKernels {
            source: "int4",
            kernels: &["int4_matvec", "int4_gemm"],
        }),
    };
    /// The requested group size (the effective one is at most `in_feat`
    /// rounded up to even, see [`Layout`]).
    type Params = usize;
    type Weight = QuantizedWeight;
    type BlobParts = (Vec<u8>, Vec<f32>, usize, usize, usize);

    fn block(group_size: usize, in_feat: usize) -> Result<Block> {
        let gs = Layout::new(in_feat, group_size)?.group_size;
        Ok(Block {
            elems: gs,
            code_bytes: gs / 2,
            scale_bytes: 4,
        })
    }

    fn params(w: &QuantizedWeight) -> usize {
        w.group_size()
    }

    fn shape(w: &QuantizedWeight) -> [usize; 2] {
        [w.out_feat(), w.in_feat()]
    }

    fn quantize(
        w: &[f32],
        out_feat: usize,
        in_feat: usize,
        group_size: usize,
    ) -> Result<QuantizedWeight> {
        let wt = transpose(w, out_feat, in_feat); // [in, out]
        QuantizedWeight::quantize_grouped(&wt, in_feat, out_feat, group_size)
    }

    fn dequantize(w: &QuantizedWeight) -> Vec<f32> {
        transpose(&w.dequantize(), w.in_feat(), w.out_feat())
    }

    fn matmul(
        w: &QuantizedWeight,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
    ) -> Result<()> {
        w.try_matmul(x, rows, y)?;
        add_bias(y, bias);
        Ok(())
    }

    fn matmul_int8_activations(
        w: &QuantizedWeight,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
    ) -> Result<()> {
        w.view().matmul_act(x, rows, y, Activations::Int8)
    }

    fn matmul_transposed(
        w: &QuantizedWeight,
        g: &[f32],
        rows: usize,
        dx: &mut [f32],
    ) -> Result<()> {
        w.try_matmul_transposed(g, rows, dx)
    }

    fn write_blob(q: &QuantizedWeight, out: &mut Writer) {
        let dims: Vec<u8> = [q.in_feat() as u32, q.out_feat() as u32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        out.tensor(DType::U32, &[2], &dims);
        out.tensor(DType::U8, &[q.data().len()], q.data());
        out.f32s(&[q.num_groups(), q.out_feat()], q.scales());
    }

    fn read_blob(r: &mut Reader<'_>) -> Result<Self::BlobParts> {
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
        Ok((packed.to_vec(), scales, in_feat, out_feat, sd[0]))
    }

    fn from_blob(
        (data, scales, in_feat, out_feat, groups): Self::BlobParts,
    ) -> Result<QuantizedWeight> {
        QuantizedWeight::from_parts(data, scales, in_feat, out_feat, groups)
    }
}
