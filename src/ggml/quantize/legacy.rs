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
/// A generic parameter of [`row`], not a function pointer, so that each
/// type's block inlines into its row loop.
pub(super) trait Block: Fn(&[f32], Option<&[f32; 32]>, &mut [u8]) {}

impl<F: Fn(&[f32], Option<&[f32; 32]>, &mut [u8])> Block for F {}

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
    block: impl Block,
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

/// Lanes of the block reductions below: eight independent running values
/// instead of one chain, which the compiler keeps in one vector register.
const LANES: usize = 8;

/// The largest `|v|` of `x` (a multiple of [`LANES`] long). A maximum is
/// exact and does not depend on the order, so the lanes give ggml's value.
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    let mut m = [0f32; LANES];
    for c in x.chunks_exact(LANES) {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    m.iter().fold(0f32, |a, &b| a.max(b))
}

/// The value of largest magnitude with its sign: ggml keeps the first `v`
/// with `amax < |v|` from `amax = 0, max = 0`, i.e. the first element of
/// the largest magnitude, and `+0` when every element is a zero. `x` is a
/// block (at most 64 values).
#[inline(always)]
pub(super) fn signed_max(x: &[f32]) -> f32 {
    debug_assert!(x.len() <= 64);
    let amax = abs_max(x);
    if amax == 0.0 {
        return 0.0;
    }
    // The first index of `amax`, from a bit mask (a compare per lane and
    // no branch: a search loop's exit mispredicts once per block).
    let mut at = 0u64;
    for (j, &v) in x.iter().enumerate() {
        at |= u64::from(v.abs() == amax) << j;
    }
    x.get(at.trailing_zeros() as usize).copied().unwrap_or(0.0)
}

/// The smallest and largest value of finite `x` (a multiple of [`LANES`]
/// long) as ggml's loop finds them with strict comparisons: the first
/// element of each value. The lanes' extremes are exact but for a zero's
/// sign (`-0 == +0`, and `f32::min` may return either), taken from the
/// first zero of the block then. `f32::min` / `max` and not `if v < m`:
/// only those compile to `minps` / `maxps` over the lanes.
#[inline(always)]
pub(super) fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = ([x[0]; LANES], [x[0]; LANES]);
    for c in x.chunks_exact(LANES) {
        for k in 0..LANES {
            lo[k] = lo[k].min(c[k]);
            hi[k] = hi[k].max(c[k]);
        }
    }
    let mut min = lo.iter().fold(x[0], |a, &b| a.min(b));
    let mut max = hi.iter().fold(x[0], |a, &b| a.max(b));
    let first_zero = || x.iter().copied().find(|&v| v == 0.0).unwrap_or(0.0);
    if min == 0.0 {
        min = first_zero();
    }
    if max == 0.0 {
        max = first_zero();
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

/// `min(trunc(t), top)` for `t >= 0` and a whole `top <= 255`: a code as
/// ggml's `(int8_t)` / `(uint8_t)` cast and `MIN(top, ...)` make it. The
/// clamp runs on the float (the same for `t >= 0`: `trunc` is monotonic
/// and `top` whole), then into `0..=255` whatever `t` and `top` are (NaN
/// included), so the unchecked conversion is sound for every input. Rust's
/// saturating `as` conversion is a scalar convert with fix-ups per value on
/// x86-64, and an integer `min` has no SSE2 instruction; the float clamps
/// (`minps` / `maxps` as written) and the conversion (`cvttps2dq`)
/// vectorize.
#[inline(always)]
pub(super) fn trunc_code(t: f32, top: f32) -> i32 {
    let t = if t < top { t } else { top };
    let t = if t < 255.0 { t } else { 255.0 };
    let t = if t > 0.0 { t } else { 0.0 };
    // SAFETY: `t` is within `0..=255` (a NaN failed `t < 255` or `t > 0`
    // and was replaced), so finite and its truncation an `i32`.
    unsafe { t.to_int_unchecked::<i32>() }
}

/// C's `roundf` (half away from zero) of `v` for `|v| <= 128`, as ggml's
/// Q8_0 rounds `x / d` (within `+-127` and a little rounding; anything
/// else, NaN included, is clamped into `+-128` first): truncate, then step
/// away from zero where the (exact) fraction is at least one half.
/// `f32::round` is a libm call per weight on x86-64 without SSE4.1; this
/// vectorizes.
#[inline(always)]
pub(super) fn round_half_away(v: f32) -> i32 {
    let v = if v > -128.0 { v } else { -128.0 };
    let v = if v < 128.0 { v } else { 128.0 };
    // SAFETY: `v` is finite and within +-128 (a NaN failed `v > -128`).
    let t = unsafe { v.to_int_unchecked::<i32>() };
    let frac = v - t as f32;
    t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)
}

/// The step and codes of Q4_0 (`nmax` 8) / Q5_0 (16): without weights the
/// reference's `d = max / -nmax` and codes `min(2 nmax - 1, trunc(x / d +
/// nmax + 0.5))` (`x / d` is within `+-nmax` and a little rounding, so the
/// truncated value is in `0..=2 nmax`); with weights `make_qx_quants(nmax)`.
fn offset_codes(x: &[f32], weights: Option<&[f32; 32]>, nmax: u8, q: &mut [u8; 32]) -> f32 {
    if let Some(w) = weights {
        return symmetric(x, nmax.into(), Some(w), q);
    }
    // A block: the fixed length lets the loops below unroll.
    let x = &x[..32];
    let d = signed_max(x) / -f32::from(nmax);
    let id = inverse(d);
    // `nmax + 0.5` is exact in f32 (8.5 / 16.5), as in the reference.
    let half = f32::from(nmax) + 0.5;
    let top = f32::from(2 * nmax - 1);
    for (c, &v) in q.iter_mut().zip(x) {
        *c = trunc_code(v * id + half, top) as u8;
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
    let x = &x[..32];
    let (min, max) = min_max(x);
    let d = (max - min) / nmax as f32;
    let id = inverse(d);
    // ggml clamps Q4_1's code to 15 and stores Q5_1's as cast; `(x - min)
    // / d + 0.5` is below `nmax + 1` (`(max - min) * id` is `nmax` and a
    // little rounding), so clamping both to `nmax` changes no code.
    let top = nmax as f32;
    for (c, &v) in q.iter_mut().zip(x) {
        *c = trunc_code((v - min) * id + 0.5, top) as u8;
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
    let x = &x[..32];
    let d = abs_max(x) / 127.0;
    let id = inverse(d);
    put_f16(b, 0, d);
    // `x / d` is within `+-127` and a little rounding.
    for (c, &v) in b[2..34].iter_mut().zip(x) {
        *c = round_half_away(v * id) as i8 as u8;
    }
}
