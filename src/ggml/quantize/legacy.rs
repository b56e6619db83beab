//! The 32-weight types (`quantize_row_q4_0_ref` ... `quantize_row_q8_0_ref`
//! and, with an importance, `quantize_row_q4_0_impl` ... of ggml; the
//! reference ones are also `gguf.quants.quantize`). Codes go through
//! `as i8` / `as u8` where ggml casts to `int8_t` / `uint8_t` (the values
//! are in range, so truncation and saturation agree).

use super::super::q5_0::pack5;
use super::super::{put_f16, GgmlType};
use super::search::{scale_min, symmetric, Sweep};

/// One block's quantizer: `x` (32 floats), the per-input weights of the
/// importance path (`None`: ggml's reference quantizer), the block bytes.
pub(super) type Block = fn(&[f32], Option<&[f32; 32]>, &mut [u8]);

/// The sweep of ggml's importance quantizers of Q4_1 / Q5_1 (and the
/// k-quants): 37 grids from `nmax - 0.9` in steps of 0.05.
pub(super) const WEIGHTED: Sweep = Sweep {
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
};

/// Quantize row `x` block by block with `block`. With `importance` each
/// input's weight is `importance_i * sqrt(sigma2 + x_i^2)`, `sigma2` the
/// row's mean `x^2` (ggml's `quantize_row_*_impl`).
pub(super) fn row<T: GgmlType>(
    x: &[f32],
    importance: Option<&[f32]>,
    out: &mut [u8],
    block: Block,
) {
    let sigma2 = importance.map(|_| {
        let mut s = 0f32;
        for &v in x {
            s += v * v;
        }
        s / x.len() as f32
    });
    for (i, (xb, b)) in x
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(T::BYTES))
        .enumerate()
    {
        let weights = importance.zip(sigma2).map(|(imp, s2)| {
            let qw = &imp[32 * i..32 * i + 32];
            std::array::from_fn(|j| qw[j] * (s2 + xb[j] * xb[j]).sqrt())
        });
        block(xb, weights.as_ref(), b);
    }
}

/// The value of largest magnitude (the first of ties) with its sign.
fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            (amax, max) = (v.abs(), v);
        }
    }
    max
}

/// The smallest and largest value.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Two nibbles per byte: code `j` low, code `j + 16` high.
fn pack_nibbles(q: &[u8; 32], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
}

/// The step and codes of Q4_0 (`nmax` 8) / Q5_0 (16): without weights the
/// reference's `d = max / -nmax` and codes `min(2 nmax - 1, trunc(x / d +
/// nmax + 0.5))`; with weights `make_qx_quants(nmax)`.
fn offset_codes(x: &[f32], weights: Option<&[f32; 32]>, nmax: u8, q: &mut [u8; 32]) -> f32 {
    if let Some(w) = weights {
        return symmetric(x, nmax.into(), Some(w), q);
    }
    let d = signed_max(x) / -f32::from(nmax);
    let id = inverse(d);
    // `nmax + 0.5` is exact in f32 (8.5 / 16.5), as in the reference.
    let half = f32::from(nmax) + 0.5;
    for (c, &v) in q.iter_mut().zip(x) {
        *c = ((v * id + half) as i8).min(2 * nmax as i8 - 1) as u8;
    }
    d
}

/// Q4_0: `d = max / -8` (the signed absmax on code 0), codes
/// `min(15, trunc(x / d + 8.5))`; with weights, `make_qx_quants(nmax 8)`.
pub(super) fn q4_0(x: &[f32], weights: Option<&[f32; 32]>, b: &mut [u8]) {
    let mut q = [0u8; 32];
    let d = offset_codes(x, weights, 8, &mut q);
    put_f16(b, 0, d);
    pack_nibbles(&q, &mut b[2..18]);
}

/// Q5_0: as Q4_0 with `d = max / -16`, codes up to 31.
pub(super) fn q5_0(x: &[f32], weights: Option<&[f32; 32]>, b: &mut [u8]) {
    let mut q = [0u8; 32];
    let d = offset_codes(x, weights, 16, &mut q);
    put_f16(b, 0, d);
    let (qh, qs) = b[2..22].split_at_mut(4);
    pack5(&q, qh, qs);
}

/// The step and minimum of Q4_1 / Q5_1 (`nmax` 15 / 31): the reference
/// spans `[min, max]` in `nmax` steps, codes `trunc((x - min) / d + 0.5)`
/// (`min(15, ...)` for Q4_1, as ggml); with weights, `make_qkx3_quants`.
fn step_min(x: &[f32], weights: Option<&[f32; 32]>, nmax: i32, q: &mut [u8; 32]) -> (f32, f32) {
    if let Some(w) = weights {
        let (d, neg_min) = scale_min(x, w, nmax, WEIGHTED, q);
        return (d, -neg_min);
    }
    let (min, max) = min_max(x);
    let d = (max - min) / nmax as f32;
    let id = inverse(d);
    for (c, &v) in q.iter_mut().zip(x) {
        let t = (v - min) * id + 0.5;
        *c = if nmax == 15 {
            (t as i8).min(15) as u8
        } else {
            t as u8
        };
    }
    (d, min)
}

/// Q4_1: `w = d * q + m`, 4-bit codes.
pub(super) fn q4_1(x: &[f32], weights: Option<&[f32; 32]>, b: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, m) = step_min(x, weights, 15, &mut q);
    put_f16(b, 0, d);
    put_f16(b, 2, m);
    pack_nibbles(&q, &mut b[4..20]);
}

/// Q5_1: `w = d * q + m`, 5-bit codes.
pub(super) fn q5_1(x: &[f32], weights: Option<&[f32; 32]>, b: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, m) = step_min(x, weights, 31, &mut q);
    put_f16(b, 0, d);
    put_f16(b, 2, m);
    let (qh, qs) = b[4..24].split_at_mut(4);
    pack5(&q, qh, qs);
}

/// Q8_0: `d = absmax / 127`, codes `round(x / d)` (half away from zero,
/// C's `roundf`); no importance path in ggml.
pub(super) fn q8_0(x: &[f32], b: &mut [u8]) {
    let mut amax = 0f32;
    for &v in x {
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    let d = amax / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    for (c, &v) in b[2..34].iter_mut().zip(x) {
        *c = ((v * id).round() as i8) as u8;
    }
}
