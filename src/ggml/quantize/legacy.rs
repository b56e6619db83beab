//! The 32-weight types (`quantize_row_q4_0_ref` ... `quantize_row_q8_0_ref`
//! and, with an importance, `quantize_row_q4_0_impl` ... of ggml; the
//! reference ones are also `gguf.quants.quantize`). Codes go through
//! `as i8` / `as u8` where ggml casts to `int8_t` / `uint8_t` (the values
//! are in range, so truncation and saturation agree).

use super::super::{put_f16, GgmlType, Q4_0, Q4_1, Q5_0, Q5_1};
use super::search::{scale_min, symmetric, Sweep};

/// One block's weighted quantizer: `x` (32 floats), the per-input weights
/// of ggml's importance path, the block bytes. A generic parameter of
/// [`row`], not a function pointer, so that each type's block inlines into
/// its row loop.
pub(super) trait Block: Fn(&[f32], &[f32; 32], &mut [u8]) {}

impl<F: Fn(&[f32], &[f32; 32], &mut [u8])> Block for F {}

/// The sweep of ggml's importance quantizers of Q4_1 / Q5_1 (and the
/// k-quants): 37 grids from `nmax - 0.9` in steps of 0.05.
pub(super) const WEIGHTED: Sweep = Sweep {
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
};

/// Quantize row `x`: without `importance` by ggml's reference quantizer
/// ([`plain_row`]), with it block by block with `weighted`, each input's
/// weight `importance_i * sqrt(sigma2 + x_i^2)`, `sigma2` the row's mean
/// `x^2` (ggml's `quantize_row_*_impl`).
pub(super) fn row<T: Plain>(
    x: &[f32],
    importance: Option<&[f32]>,
    out: &mut [u8],
    weighted: impl Block,
) {
    let Some(imp) = importance else {
        return plain_row::<T>(x, out);
    };
    let mut s2 = 0f32;
    for &v in x {
        s2 += v * v;
    }
    let s2 = s2 / x.len() as f32;
    for (i, (xb, b)) in x
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(T::BYTES))
        .enumerate()
    {
        let qw = &imp[32 * i..32 * i + 32];
        let weights = std::array::from_fn(|j| qw[j] * (s2 + xb[j] * xb[j]).sqrt());
        weighted(xb, &weights, b);
    }
}

/// The reference quantizer of a 32-weight type with a step `d = num / DIV`
/// and its inverse `id = 1 / d` (0 for `d = 0`), split at those two
/// divisions so that a row's blocks can share them ([`plain_row`]).
pub(super) trait Plain: GgmlType {
    /// The step's divisor (ggml's `-8`, `-16`, `15`, `31`).
    const DIV: f32;
    /// Blocks per group of [`plain_row`]: 4 or 1.
    const GROUP: usize;
    /// The block's step numerator and offset (its minimum, or 0).
    fn stats(x: &[f32]) -> (f32, f32);
    /// Write the block `b` of `x` from its step, inverse and offset.
    fn write(x: &[f32], d: f32, id: f32, offset: f32, b: &mut [u8]);
}

/// Quantize row `x` by `T`'s reference quantizer, `T::GROUP` blocks at a
/// time: the blocks' statistics, then their steps and inverses together
/// (a block's two divisions are a chain of about 20 cycles that the next
/// block's work hides only in part; side by side they are one vector
/// division each), then the codes. Each value is the formula of one block,
/// so the bytes are those of one block at a time.
fn plain_row<T: Plain>(x: &[f32], out: &mut [u8]) {
    if T::GROUP == 4 {
        plain_groups::<T, 4>(x, out);
    } else {
        plain_groups::<T, 1>(x, out);
    }
}

/// [`plain_row`] `N` blocks at a time, the rest one at a time.
#[inline(always)]
fn plain_groups<T: Plain, const N: usize>(x: &[f32], out: &mut [u8]) {
    let mut xs = x.chunks_exact(32 * N);
    let mut bs = out.chunks_exact_mut(T::BYTES * N);
    for (xg, bg) in (&mut xs).zip(&mut bs) {
        plain_group::<T, N>(xg, bg);
    }
    let rest = bs.into_remainder().chunks_exact_mut(T::BYTES);
    for (xb, b) in xs.remainder().chunks_exact(32).zip(rest) {
        plain_group::<T, 1>(xb, b);
    }
}

/// `N` blocks of [`plain_row`] (`x`: `32 N` floats, `out`: `N` blocks).
#[inline(always)]
fn plain_group<T: Plain, const N: usize>(x: &[f32], out: &mut [u8]) {
    let (mut num, mut offset) = ([0f32; N], [0f32; N]);
    for k in 0..N {
        (num[k], offset[k]) = T::stats(&x[32 * k..32 * k + 32]);
    }
    let d: [f32; N] = std::array::from_fn(|k| num[k] / T::DIV);
    let id: [f32; N] = std::array::from_fn(|k| inverse(d[k]));
    for k in 0..N {
        let b = &mut out[T::BYTES * k..T::BYTES * (k + 1)];
        T::write(&x[32 * k..32 * k + 32], d[k], id[k], offset[k], b);
    }
}

/// Lanes of the block reductions below: eight independent running values
/// instead of one chain, which the compiler keeps in vector registers.
const LANES: usize = 8;

/// `a < b ? a : b`, which compiles to `minps` / `minss` (`b` where the two
/// are equal or either is NaN). `f32::min` also returns the non-NaN operand
/// of a NaN, which costs a compare and three masks per vector; the values
/// here are finite (each row is checked before it is quantized).
#[inline(always)]
fn lesser(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// `a > b ? a : b`, `maxps` / `maxss` (see [`lesser`]).
#[inline(always)]
fn greater(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Halve `m` lane by lane with `pick` down to one value: a tree, so that
/// the compiler keeps the first halvings in vector registers.
#[inline(always)]
fn fold_lanes(mut m: [f32; LANES], pick: impl Fn(f32, f32) -> f32) -> f32 {
    let mut n = LANES / 2;
    while n > 0 {
        for k in 0..n {
            m[k] = pick(m[k], m[k + n]);
        }
        n /= 2;
    }
    m[0]
}

/// The largest `|v|` of `x` (a multiple of [`LANES`] long, finite). A
/// maximum is exact and does not depend on the order, so the lanes give
/// ggml's value.
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    let mut m = [0f32; LANES];
    for c in x.chunks_exact(LANES) {
        for (m, &v) in m.iter_mut().zip(c) {
            *m = greater(*m, v.abs());
        }
    }
    fold_lanes(m, greater)
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
/// sign (`-0 == +0`, and which of two zeros a lane keeps depends on the
/// order), taken from the first zero of the block then.
#[inline(always)]
pub(super) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut lo = [0f32; LANES];
    lo.copy_from_slice(&x[..LANES]);
    let mut hi = lo;
    for c in x.chunks_exact(LANES).skip(1) {
        for k in 0..LANES {
            lo[k] = lesser(lo[k], c[k]);
            hi[k] = greater(hi[k], c[k]);
        }
    }
    let mut min = fold_lanes(lo, lesser);
    let mut max = fold_lanes(hi, greater);
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

/// Two codes per byte, `code(j)` low and `code(j + 16)` high (`qs`: 16
/// bytes; codes `0..=15`). The codes come from a function rather than an
/// array: the plain quantizers compute them here, in vector registers, and
/// never store them as bytes. (Codes stored byte by byte and read back 16
/// at a time stall on store forwarding: that reload was half of the plain
/// block's time.)
#[inline(always)]
fn pack_nibbles(code: impl Fn(usize) -> i32, qs: &mut [u8]) {
    let qs = &mut qs[..16];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = (code(j) | (code(j + 16) << 4)) as u8;
    }
}

/// Five-bit codes `code(j)` (`0..=31`): the low nibbles as
/// [`pack_nibbles`] into `qs` (16 bytes), bit 4 of code `j` at bit `j` of
/// the little-endian `qh` (4 bytes), as ggml's Q5_0 / Q5_1.
#[inline(always)]
fn pack_fifths(code: impl Fn(usize) -> i32, qh: &mut [u8], qs: &mut [u8]) {
    let qs = &mut qs[..16];
    let mut h = 0u32;
    for (j, b) in qs.iter_mut().enumerate() {
        let (lo, hi) = (code(j), code(j + 16));
        *b = ((lo & 0x0F) | ((hi & 0x0F) << 4)) as u8;
        h |= ((lo as u32 >> 4) << j) | ((hi as u32 >> 4) << (j + 16));
    }
    qh[..4].copy_from_slice(&h.to_le_bytes());
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

/// Q4_0 (ggml's reference): `d = max / -8` (the signed absmax on code 0),
/// codes `min(15, trunc(x / d + 8.5))` (`x / d` is within `+-8` and a
/// little rounding, so the truncated value is in `0..=16`; `8.5` is exact,
/// as in the reference).
impl Plain for Q4_0 {
    const DIV: f32 = -8.0;
    // One running maximum (two vector registers) per block.
    const GROUP: usize = 4;
    #[inline(always)]
    fn stats(x: &[f32]) -> (f32, f32) {
        (signed_max(&x[..32]), 0.0)
    }
    #[inline(always)]
    fn write(x: &[f32], d: f32, id: f32, _: f32, b: &mut [u8]) {
        let x = &x[..32];
        put_f16(b, 0, d);
        pack_nibbles(|j| trunc_code(x[j] * id + 8.5, 15.0), &mut b[2..18]);
    }
}

/// Q5_0: as Q4_0 with `d = max / -16`, codes `min(31, trunc(x / d +
/// 16.5))`.
impl Plain for Q5_0 {
    const DIV: f32 = -16.0;
    // One running maximum (two vector registers) per block.
    const GROUP: usize = 4;
    #[inline(always)]
    fn stats(x: &[f32]) -> (f32, f32) {
        (signed_max(&x[..32]), 0.0)
    }
    #[inline(always)]
    fn write(x: &[f32], d: f32, id: f32, _: f32, b: &mut [u8]) {
        let x = &x[..32];
        put_f16(b, 0, d);
        let (qh, qs) = b[2..22].split_at_mut(4);
        pack_fifths(|j| trunc_code(x[j] * id + 16.5, 31.0), qh, qs);
    }
}

/// Q4_1: `d = (max - min) / 15` spanning `[min, max]`, codes `min(15,
/// trunc((x - min) / d + 0.5))`.
impl Plain for Q4_1 {
    const DIV: f32 = 15.0;
    // A running minimum and maximum (four vector registers) per block:
    // two or four blocks side by side spill, and measured 0.92-0.96 and
    // about 0.7 of the speed of one at a time.
    const GROUP: usize = 1;
    #[inline(always)]
    fn stats(x: &[f32]) -> (f32, f32) {
        let (min, max) = min_max(&x[..32]);
        (max - min, min)
    }
    #[inline(always)]
    fn write(x: &[f32], d: f32, id: f32, min: f32, b: &mut [u8]) {
        let x = &x[..32];
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        pack_nibbles(|j| trunc_code((x[j] - min) * id + 0.5, 15.0), &mut b[4..20]);
    }
}

/// Q5_1: as Q4_1 with `d = (max - min) / 31`. ggml stores Q5_1's code as
/// cast, without Q4_1's `MIN`; `(x - min) / d + 0.5` is below 32 (`(max -
/// min) * id` is 31 and a little rounding), so the clamp to 31 changes no
/// code.
impl Plain for Q5_1 {
    const DIV: f32 = 31.0;
    // A running minimum and maximum (four vector registers) per block:
    // two or four blocks side by side spill, and measured 0.92-0.96 and
    // about 0.7 of the speed of one at a time.
    const GROUP: usize = 1;
    #[inline(always)]
    fn stats(x: &[f32]) -> (f32, f32) {
        let (min, max) = min_max(&x[..32]);
        (max - min, min)
    }
    #[inline(always)]
    fn write(x: &[f32], d: f32, id: f32, min: f32, b: &mut [u8]) {
        let x = &x[..32];
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        let (qh, qs) = b[4..24].split_at_mut(4);
        pack_fifths(|j| trunc_code((x[j] - min) * id + 0.5, 31.0), qh, qs);
    }
}

/// Q4_0 / Q5_0 with weights: `make_qx_quants(nmax 8 / 16)`.
pub(super) fn q4_0(x: &[f32], w: &[f32; 32], b: &mut [u8]) {
    let mut q = [0u8; 32];
    put_f16(b, 0, symmetric(x, 8, Some(w), &mut q));
    pack_nibbles(|j| i32::from(q[j]), &mut b[2..18]);
}

/// Q5_0 with weights (see [`q4_0`]).
pub(super) fn q5_0(x: &[f32], w: &[f32; 32], b: &mut [u8]) {
    let mut q = [0u8; 32];
    put_f16(b, 0, symmetric(x, 16, Some(w), &mut q));
    let (qh, qs) = b[2..22].split_at_mut(4);
    pack_fifths(|j| i32::from(q[j]), qh, qs);
}

/// Q4_1 / Q5_1 with weights: `make_qkx3_quants(nmax 15 / 31)`, `w = d q
/// + m` with `m = -min`.
pub(super) fn q4_1(x: &[f32], w: &[f32; 32], b: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, neg_min) = scale_min(x, w, 15, WEIGHTED, &mut q);
    put_f16(b, 0, d);
    put_f16(b, 2, -neg_min);
    pack_nibbles(|j| i32::from(q[j]), &mut b[4..20]);
}

/// Q5_1 with weights (see [`q4_1`]).
pub(super) fn q5_1(x: &[f32], w: &[f32; 32], b: &mut [u8]) {
    let mut q = [0u8; 32];
    let (d, neg_min) = scale_min(x, w, 31, WEIGHTED, &mut q);
    put_f16(b, 0, d);
    put_f16(b, 2, -neg_min);
    let (qh, qs) = b[4..24].split_at_mut(4);
    pack_fifths(|j| i32::from(q[j]), qh, qs);
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
