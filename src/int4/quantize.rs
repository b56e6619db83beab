//! Building the packed format: absmax scales, rounding, nibble packing, and
//! the inverse (dequantization). Scalar code written so the compiler can
//! vectorize it across the output dimension; rayon splits groups.

use rayon::prelude::*;

use super::{Layout, QuantizedWeight, MIN_SCALE};

/// 1.5 * 2^23: adding and subtracting it rounds an f32 of magnitude below
/// 2^22 to the nearest integer, ties to even (the IEEE default mode), which
/// is exactly NumPy's `np.round`. Cheaper than `round_ties_even` without
/// SSE4.1 and vectorizable.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Work below this many weights runs on the calling thread.
const PAR_MIN_WEIGHTS: usize = 1 << 16;

/// Index of the first NaN or infinity, if any.
pub fn first_non_finite(w: &[f32]) -> Option<usize> {
    // Fast check per chunk (vectorizes), exact position only on failure.
    const CHUNK: usize = 4096;
    for (c, chunk) in w.chunks(CHUNK).enumerate() {
        let all_finite = chunk.iter().fold(true, |ok, v| {
            ok & (v.to_bits() & 0x7F80_0000 != 0x7F80_0000)
        });
        if !all_finite {
            let i = chunk.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Some(c * CHUNK + i);
        }
    }
    None
}

/// `max(absmax(w[rows of g, o]) / 7, MIN_SCALE)` for every group and output.
pub fn absmax_scales(w: &[f32], in_feat: usize, out_feat: usize, layout: &Layout) -> Vec<f32> {
    let gs = layout.group_size;
    let mut scales = vec![0.0f32; layout.num_groups * out_feat];
    let one_group = |(g, srow): (usize, &mut [f32])| {
        let rows = (g * gs)..((g + 1) * gs).min(in_feat);
        for r in rows {
            let wrow = &w[r * out_feat..(r + 1) * out_feat];
            for (s, v) in srow.iter_mut().zip(wrow) {
                *s = s.max(v.abs());
            }
        }
        for s in srow.iter_mut() {
            *s = (*s / 7.0).max(MIN_SCALE);
        }
    };
    if w.len() >= PAR_MIN_WEIGHTS {
        scales
            .par_chunks_mut(out_feat)
            .enumerate()
            .for_each(one_group);
    } else {
        scales.chunks_mut(out_feat).enumerate().for_each(one_group);
    }
    scales
}

/// The signed 4-bit code of `v` at `scale`: `clamp(round_half_even(v / scale), -8, 7)`.
#[inline(always)]
pub fn quantize_value(v: f32, scale: f32) -> i8 {
    let t = (v / scale).clamp(-8.0, 7.0);
    ((t + ROUND_MAGIC) - ROUND_MAGIC) as i8
}

/// Pack `w` with the given scales into the nibble layout of the module docs.
pub fn pack(
    w: &[f32],
    in_feat: usize,
    out_feat: usize,
    layout: &Layout,
    scales: &[f32],
) -> Vec<u8> {
    let gs = layout.group_size;
    let mut data = vec![0u8; layout.num_pairs() * out_feat];
    let one_pair = |(p, drow): (usize, &mut [u8])| {
        let g = 2 * p / gs;
        let srow = &scales[g * out_feat..(g + 1) * out_feat];
        let row = |r: usize| (r < in_feat).then(|| &w[r * out_feat..(r + 1) * out_feat]);
        match (row(2 * p), row(2 * p + 1)) {
            (Some(lo), Some(hi)) => {
                for o in 0..out_feat {
                    let ql = quantize_value(lo[o], srow[o]) as u8 & 0x0F;
                    let qh = quantize_value(hi[o], srow[o]) as u8 & 0x0F;
                    drow[o] = ql | (qh << 4);
                }
            }
            (Some(lo), None) => {
                for o in 0..out_feat {
                    drow[o] = quantize_value(lo[o], srow[o]) as u8 & 0x0F;
                }
            }
            _ => {} // padding rows quantize to 0
        }
    };
    if w.len() >= PAR_MIN_WEIGHTS {
        data.par_chunks_mut(out_feat).enumerate().for_each(one_pair);
    } else {
        data.chunks_mut(out_feat).enumerate().for_each(one_pair);
    }
    data
}

/// `out[r, o] = code(r, o) * scale[g(r), o]` for the unpadded rows.
pub fn dequantize_into(qw: &QuantizedWeight, out: &mut [f32]) {
    let out_feat = qw.out_feat;
    let gs = qw.group_size();
    let one_pair = |(p, rows): (usize, &mut [f32])| {
        let g = 2 * p / gs;
        let srow = &qw.scales[g * out_feat..(g + 1) * out_feat];
        let drow = &qw.data[p * out_feat..(p + 1) * out_feat];
        let (lo, hi) = rows.split_at_mut(out_feat.min(rows.len()));
        for o in 0..out_feat {
            lo[o] = (((drow[o] << 4) as i8) >> 4) as f32 * srow[o];
        }
        for (o, h) in hi.iter_mut().enumerate() {
            *h = ((drow[o] as i8) >> 4) as f32 * srow[o];
        }
    };
    if out.len() >= PAR_MIN_WEIGHTS {
        out.par_chunks_mut(2 * out_feat)
            .enumerate()
            .for_each(one_pair);
    } else {
        out.chunks_mut(2 * out_feat).enumerate().for_each(one_pair);
    }
}
