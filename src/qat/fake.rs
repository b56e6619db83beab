//! Fake quantization (quantize then dequantize) and its straight-through
//! backward. (Over 400 lines: the integer and FP8 paths share the rounding
//! and chunking helpers.)
//!
//! Integer: `y = x / scale + zp` (a true division), clamped to
//! `[qmin, qmax]`, rounded, and `fake = (q - zp) * scale`, all in f64 (an
//! f32 input is widened first and the result rounded back). Clamping before
//! rounding gives the same codes as rounding first, since the bounds are
//! integers. NaN passes through; +-inf saturate.
//!
//! FP8: a saturating cast onto the grid (NaN passes through); stochastic
//! rounding picks one of the two neighbouring grid values.
//!
//! Rounding: nearest is ties-to-even; stochastic rounds up with probability
//! equal to the distance from the lower neighbour, using
//! [`super::rng::uniform`] of the element's global index, so any split of
//! the work gives the same result.

use rayon::prelude::*;

use super::element::{f64_to_f32_odd, Master};
use super::params::QuantParams;
use super::rng::uniform;
use crate::error::{QuantError, Result};
use crate::fp8::{decode_scalar, encode_scalar, round_to_grid_scalar, Fp8Format};

/// Elements per parallel task: big enough to amortize scheduling, small
/// enough to stay in L2 while a task runs.
pub(crate) const CHUNK: usize = 1 << 14;

/// Rounding of one call: nearest, or stochastic with a stream key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Round to nearest, ties to even.
    Nearest,
    /// Round up with probability equal to the fraction, drawing from the
    /// stream `key`.
    Stochastic {
        /// The stream key (`rng::stream_key(seed, step)`).
        key: u64,
    },
}

/// 1.5 * 2^52: adding and subtracting it rounds an |y| < 2^51 to an integer
/// with the FPU's round-to-nearest-even, without a libm call.
const MAGIC: f64 = 6_755_399_441_055_744.0;

/// `y.round_ties_even()` for |y| < 2^51 (and NaN), vectorizable on any
/// x86-64 level; `copysign` keeps the sign of a zero result (-0.3 -> -0.0).
#[inline(always)]
fn round_even(y: f64) -> f64 {
    ((y + MAGIC) - MAGIC).copysign(y)
}

/// The integer grid of one quantizer, precomputed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IntGrid {
    scale: f64,
    zp: f64,
    lo: f64,
    hi: f64,
}

impl IntGrid {
    pub(crate) fn new(p: &QuantParams) -> IntGrid {
        IntGrid {
            scale: p.scale,
            zp: p.zero_point as f64,
            lo: p.qmin as f64,
            hi: p.qmax as f64,
        }
    }

    /// The code of `x` (as an f64 integer, or NaN). `u` is the uniform draw
    /// for stochastic rounding, `None` for nearest.
    #[inline(always)]
    pub(crate) fn code(&self, x: f64, u: Option<f64>) -> f64 {
        let y = x / self.scale + self.zp;
        let y = if y < self.lo {
            self.lo
        } else if y > self.hi {
            self.hi
        } else {
            y
        };
        match u {
            None => round_even(y),
            Some(u) => {
                let r = round_even(y);
                let fl = if r > y { r - 1.0 } else { r };
                if u < y - fl {
                    fl + 1.0
                } else {
                    fl
                }
            }
        }
    }

    #[inline(always)]
    pub(crate) fn fake(&self, x: f64, u: Option<f64>) -> f64 {
        (self.code(x, u) - self.zp) * self.scale
    }
}

#[inline(always)]
pub(crate) fn draw(r: Rounding, index: usize) -> Option<f64> {
    match r {
        Rounding::Nearest => None,
        Rounding::Stochastic { key } => Some(uniform(key, index as u64)),
    }
}

/// Integer fake quantization of a chunk whose first element has global
/// index `offset`.
#[inline(always)]
pub(crate) fn fake_int_chunk<T: Master>(
    x: &[T],
    out: &mut [T],
    g: &IntGrid,
    r: Rounding,
    offset: usize,
) {
    match r {
        Rounding::Nearest => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = T::from_f64(g.fake(v.into(), None));
            }
        }
        Rounding::Stochastic { .. } => {
            for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                *o = T::from_f64(g.fake(v.into(), draw(r, offset + i)));
            }
        }
    }
}

/// Stochastic rounding of `x` onto the FP8 grid (saturating, NaN kept).
pub fn fp8_stochastic(x: f64, fmt: Fp8Format, u: f64) -> f64 {
    let max = fmt.max_value() as f64;
    if x.is_nan() {
        return x;
    }
    if x.abs() >= max {
        return max.copysign(x);
    }
    let near = round_to_grid_scalar(f64_to_f32_odd(x), fmt, true) as f64;
    if near == x {
        return near;
    }
    // The other neighbour, one code further from or closer to zero.
    let code = encode_scalar(near.abs() as f32, fmt, true);
    let other_code = if near.abs() < x.abs() {
        code + 1
    } else {
        code - 1
    };
    let other = (decode_scalar(other_code, fmt) as f64).copysign(x);
    let (lo, hi) = if near < other {
        (near, other)
    } else {
        (other, near)
    };
    if u < (x - lo) / (hi - lo) {
        hi
    } else {
        lo
    }
}

/// FP8 fake quantization of a chunk whose first element has global index
/// `offset`.
pub(crate) fn fake_fp8_chunk<T: Master>(
    x: &[T],
    out: &mut [T],
    fmt: Fp8Format,
    r: Rounding,
    offset: usize,
) {
    match r {
        Rounding::Nearest => T::fp8_round(x, out, fmt),
        Rounding::Stochastic { key } => {
            for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                let u = uniform(key, (offset + i) as u64);
                *o = T::from_f64(fp8_stochastic(v.into(), fmt, u));
            }
        }
    }
}

fn same_len(what: &str, expected: usize, actual: usize) -> Result<()> {
    if expected != actual {
        return Err(QuantError::dims(what, expected, actual));
    }
    Ok(())
}

/// `out = fake_quant(x)` on the integer grid of `p`.
pub fn fake_quant_int<T: Master>(
    x: &[T],
    out: &mut [T],
    p: &QuantParams,
    r: Rounding,
) -> Result<()> {
    same_len("out", x.len(), out.len())?;
    let g = IntGrid::new(p);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, xs))| fake_int_chunk(xs, o, &g, r, c * CHUNK));
    Ok(())
}

/// `out = cast_to_fp8_grid(x)` (saturating; NaN passes through).
pub fn fake_quant_fp8<T: Master>(
    x: &[T],
    out: &mut [T],
    fmt: Fp8Format,
    r: Rounding,
) -> Result<()> {
    same_len("out", x.len(), out.len())?;
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, xs))| fake_fp8_chunk(xs, o, fmt, r, c * CHUNK));
    Ok(())
}

/// An integer code type (`i8` or `i32`).
pub trait Code: Copy + Send + Sync {
    /// The code `q` (an integer-valued f64 in range) as this type.
    fn from_code(q: f64) -> Self;
}
impl Code for i8 {
    #[inline(always)]
    fn from_code(q: f64) -> i8 {
        q as i8
    }
}
impl Code for i32 {
    #[inline(always)]
    fn from_code(q: f64) -> i32 {
        q as i32
    }
}

/// `out = quantize(x)`: the integer codes. Non-finite input has no code:
/// NaN is an error naming its index, +-inf saturate.
pub fn quantize_int<T: Master, C: Code>(
    x: &[T],
    out: &mut [C],
    p: &QuantParams,
    r: Rounding,
) -> Result<()> {
    same_len("out", x.len(), out.len())?;
    if let Some(i) = x.iter().position(|&v| v.into().is_nan()) {
        return Err(QuantError::arg(format!(
            "x: NaN at index {i} has no integer code"
        )));
    }
    let g = IntGrid::new(p);
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .enumerate()
        .for_each(|(c, (o, xs))| {
            for (i, (o, &v)) in o.iter_mut().zip(xs).enumerate() {
                *o = C::from_code(g.code(v.into(), draw(r, c * CHUNK + i)));
            }
        });
    Ok(())
}

/// Straight-through estimator: `grad` where `lo <= x <= hi`, else 0 (NaN
/// `x` gets 0: it is outside every range). The bounds may come in either
/// order; a NaN bound is an error.
pub fn fake_quant_backward<T: Master>(
    grad: &[T],
    x: &[T],
    lo: f64,
    hi: f64,
    out: &mut [T],
) -> Result<()> {
    same_len("x", grad.len(), x.len())?;
    same_len("out", grad.len(), out.len())?;
    if lo.is_nan() || hi.is_nan() {
        return Err(QuantError::arg(format!(
            "lo/hi: expected numbers, got lo={lo}, hi={hi}"
        )));
    }
    // The bounds in either order, as the original API took them.
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    out.par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK).zip(x.par_chunks(CHUNK)))
        .for_each(|(o, (g, xs))| {
            for (o, (&g, &v)) in o.iter_mut().zip(g.iter().zip(xs)) {
                let v: f64 = v.into();
                *o = if v >= lo && v <= hi { g } else { T::ZERO };
            }
        });
    Ok(())
}

/// Per-channel integer fake quantization of a row-major `[rows, cols]`
/// tensor with one quantizer per index along `axis`.
pub fn fake_quant_per_channel<T: Master>(
    x: &[T],
    shape: [usize; 2],
    axis: usize,
    params: &[QuantParams],
    r: Rounding,
    out: &mut [T],
) -> Result<()> {
    let [rows, cols] = shape;
    same_len("x", rows * cols, x.len())?;
    same_len("out", x.len(), out.len())?;
    let channels = match axis {
        0 => rows,
        1 => cols,
        _ => {
            return Err(QuantError::arg(format!(
                "axis: expected 0 or 1 for a 2-D tensor, got {axis}"
            )))
        }
    };
    same_len("params", channels, params.len())?;
    let grids: Vec<IntGrid> = params.iter().map(IntGrid::new).collect();
    if cols == 0 {
        return Ok(());
    }
    out.par_chunks_mut(cols)
        .zip(x.par_chunks(cols))
        .enumerate()
        .for_each(|(row, (o, xs))| {
            let base = row * cols;
            for (c, (o, &v)) in o.iter_mut().zip(xs).enumerate() {
                let g = if axis == 0 { &grids[row] } else { &grids[c] };
                *o = T::from_f64(g.fake(v.into(), draw(r, base + c)));
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qat::config::IntDtype;

    #[test]
    fn nearest_rounds_half_to_even_and_clamps() {
        let p = QuantParams::new(1.0, 0, -7, 7).unwrap();
        let x = [0.5, 1.5, 2.5, -0.5, -2.5, 7.6, -100.0, f64::INFINITY, 3.2];
        let mut out = [0.0; 9];
        fake_quant_int(&x, &mut out, &p, Rounding::Nearest).unwrap();
        assert_eq!(out, [0.0, 2.0, 2.0, -0.0, -2.0, 7.0, -7.0, 7.0, 3.0]);
        let mut nan = [0.0];
        fake_quant_int(&[f64::NAN], &mut nan, &p, Rounding::Nearest).unwrap();
        assert!(nan[0].is_nan());
    }

    #[test]
    fn stochastic_is_unbiased_and_adjacent() {
        let p = QuantParams::from_absmax(12.7, IntDtype::Int8).unwrap();
        let n = 200_000;
        let x = vec![3.07f64; n];
        let mut out = vec![0.0; n];
        fake_quant_int(&x, &mut out, &p, Rounding::Stochastic { key: 42 }).unwrap();
        let lo = 30.0 * p.scale;
        let hi = 31.0 * p.scale;
        assert!(out.iter().all(|&v| v == lo || v == hi));
        let mean = out.iter().sum::<f64>() / n as f64;
        assert!((mean - 3.07).abs() < 2e-3, "{mean}");
    }

    #[test]
    fn fp8_vectors() {
        let f = Fp8Format::E4M3;
        let x = [1.1f32, 449.0, 1000.0, f32::INFINITY, -1000.0, f32::NAN];
        let mut out = [0.0f32; 6];
        fake_quant_fp8(&x, &mut out, f, Rounding::Nearest).unwrap();
        assert_eq!(&out[..5], &[1.125, 448.0, 448.0, 448.0, -448.0]);
        assert!(out[5].is_nan());
        let mut o = [0.0f32];
        fake_quant_fp8(&[60000.0f32], &mut o, Fp8Format::E5M2, Rounding::Nearest).unwrap();
        assert_eq!(o[0], 57344.0);
    }

    #[test]
    fn fp8_stochastic_picks_neighbours() {
        let f = Fp8Format::E4M3;
        // 1.1 lies between 1.0 and 1.125 (80 % of the way up).
        let n = 100_000;
        let mut up = 0;
        for i in 0..n {
            let v = fp8_stochastic(-1.1, f, uniform(9, i));
            assert!(v == -1.0 || v == -1.125, "{v}");
            up += (v == -1.0) as usize;
        }
        let p = up as f64 / n as f64;
        assert!((p - 0.2).abs() < 0.01, "{p}");
        assert_eq!(fp8_stochastic(1.0, f, 0.999), 1.0);
        assert_eq!(fp8_stochastic(500.0, f, 0.0), 448.0);
        assert_eq!(fp8_stochastic(1e-4, f, 0.999), 0.0);
    }

    #[test]
    fn ste_masks_outside() {
        let g = [1.0, 2.0, 3.0, 4.0];
        let x = [-2.0, -1.0, 1.0, f64::NAN];
        let mut out = [9.0; 4];
        fake_quant_backward(&g, &x, -1.0, 1.0, &mut out).unwrap();
        assert_eq!(out, [0.0, 2.0, 3.0, 0.0]);
    }
}
