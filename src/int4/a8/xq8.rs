//! `x` quantized to int8 per group of the weight's input rows, for the
//! `activations = "int8"` matvec (docs/int4.md, "Int8 activations").
//!
//! The scheme is ggml's Q8_0 idea (one scale per block of inputs, absmax /
//! 127, symmetric), with the block being the weight's scale group so that
//! one integer dot product per group and column meets exactly one weight
//! scale and one activation scale:
//! - `d[g] = absmax(x[rows of g]) / 127` (f32 division);
//! - `q[i] = clamp(round_half_even(x[i] / d[g]), -127, 127)` (true
//!   division, so NumPy's `np.rint(x / d)` reproduces it bit for bit);
//! - a group whose `d` would be subnormal (absmax below `127 * 2^-126`)
//!   is stored as `d = 0`, `q = 0`: a subnormal `d` carries too few bits
//!   for the `|x - q d| <= d / 2` bound, and such groups add less than
//!   `1.5e-36 * sum |w|` to any output.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::error::{QuantError, Result};
#[cfg(target_arch = "x86_64")]
use crate::simd::Avx2;

/// The token of the AVX2 build of the quantizer (a unit type elsewhere).
#[cfg(target_arch = "x86_64")]
pub(crate) type Fast = Avx2;
/// The token of the AVX2 build of the quantizer (a unit type elsewhere).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type Fast = ();

/// Largest |q|: symmetric, so `-q` never overflows and the kernels'
/// products stay within `15 * 127`.
pub(crate) const Q_MAX: f32 = 127.0;

/// Rows of `x` in int8, zero-padded to `pitch` (= `in_padded`) each.
#[derive(Clone, Debug)]
pub(crate) struct Xq8 {
    /// Codes, `[rows * pitch]`.
    pub q: Vec<i8>,
    /// Scales, `[rows * num_groups]`.
    pub d: Vec<f32>,
    /// Per row and group, the sum of its codes (the AVX2 kernel offsets the
    /// weight nibbles by 8 and takes `8 * sum` back off).
    pub sums: Vec<i32>,
    /// Rows of `x`.
    pub rows: usize,
    /// Codes per row (`in_padded`).
    pub pitch: usize,
    /// Groups per row.
    pub num_groups: usize,
}

impl Xq8 {
    /// Quantize `x` `[rows, in_feat]` in groups of `group_size` (the last
    /// one zero-padded up to `pitch`). A NaN or infinity is an error: it
    /// has no int8 code (the float32 path propagates it instead).
    ///
    /// With `fast` the same code runs compiled for AVX2 (8 lanes); the
    /// operations, and so the codes, are the same.
    pub(crate) fn quantize(
        x: &[f32],
        rows: usize,
        in_feat: usize,
        pitch: usize,
        group_size: usize,
        fast: Option<Fast>,
    ) -> Result<Xq8> {
        debug_assert!(x.len() == rows * in_feat && pitch >= in_feat);
        debug_assert!(group_size > 0 && pitch.is_multiple_of(group_size));
        let num_groups = pitch / group_size;
        let mut out = Xq8 {
            q: vec![0; rows * pitch],
            d: vec![0.0; rows * num_groups],
            sums: vec![0; rows * num_groups],
            rows,
            pitch,
            num_groups,
        };
        let shape = RowShape {
            in_feat,
            pitch,
            group_size,
        };
        let finite = if rows * in_feat < PAR_MIN_VALUES {
            quantize_band(x, &shape, out.whole_band(), fast)
        } else {
            // Rows are independent, so bands of them on the pool give the
            // codes of one pass exactly. At M = 512 one thread spent
            // 0.5-0.9 ms here before a GEMM the pool shares (Zen 3,
            // docs/benchmarks.md).
            let all_finite = AtomicBool::new(true);
            let bands: Vec<Mutex<Band>> = out
                .q
                .chunks_mut(BAND_ROWS * pitch)
                .zip(out.d.chunks_mut(BAND_ROWS * num_groups))
                .zip(out.sums.chunks_mut(BAND_ROWS * num_groups))
                .map(|((q, d), sums)| Mutex::new(Band { q, d, sums }))
                .collect();
            crate::par::for_each_block(bands.len(), |b| {
                let mut band = bands[b].lock().unwrap_or_else(|e| e.into_inner());
                let r0 = b * BAND_ROWS;
                let xb = &x[r0 * in_feat..(r0 + BAND_ROWS).min(rows) * in_feat];
                if !quantize_band(xb, &shape, band.reborrow(), fast) {
                    all_finite.store(false, Ordering::Relaxed);
                }
            });
            all_finite.load(Ordering::Relaxed)
        };
        if !finite {
            return Err(QuantError::non_finite_activation(x, in_feat));
        }
        Ok(out)
    }

    /// The whole of `self` as one band.
    fn whole_band(&mut self) -> Band<'_> {
        Band {
            q: &mut self.q,
            d: &mut self.d,
            sums: &mut self.sums,
        }
    }

    /// Codes of row `r`.
    pub(crate) fn row(&self, r: usize) -> &[i8] {
        &self.q[r * self.pitch..(r + 1) * self.pitch]
    }
}

/// Rows of `x` per band quantized on the pool (36 KiB of a 576-wide
/// `x`: 32 bands at M = 512, enough for the threads to share evenly).
const BAND_ROWS: usize = 16;
/// Values of `x` from which bands go to the pool (a decode step's `x` stays
/// on the calling thread).
const PAR_MIN_VALUES: usize = 1 << 15;

/// The row layout of `x` and its codes.
struct RowShape {
    in_feat: usize,
    pitch: usize,
    group_size: usize,
}

/// The codes, scales and sums of a band of consecutive rows.
struct Band<'a> {
    q: &'a mut [i8],
    d: &'a mut [f32],
    sums: &'a mut [i32],
}

impl Band<'_> {
    /// The same rows, borrowed again (a band behind a lock is handed on).
    fn reborrow(&mut self) -> Band<'_> {
        Band {
            q: self.q,
            d: self.d,
            sums: self.sums,
        }
    }
}

/// Quantize the rows of `x` into `out` (the band's rows); false, with
/// `out` unspecified, when some value is inf or NaN.
fn quantize_band(x: &[f32], shape: &RowShape, out: Band, fast: Option<Fast>) -> bool {
    // One vectorizable pass (exponent all ones: inf or NaN); where, only
    // on the error path.
    let exp = 0x7F80_0000u32;
    if x.iter()
        .fold(false, |bad, v| bad | (v.to_bits() & exp == exp))
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = fast {
        // SAFETY: the token proves AVX2 and FMA.
        unsafe { quantize_avx2(t, x, shape, out) };
        return true;
    }
    let _ = fast;
    quantize_rows(x, shape, out);
    true
}

/// [`quantize_rows`] compiled for AVX2.
///
/// # Safety
/// None beyond the token: it proves AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(_: Avx2, x: &[f32], shape: &RowShape, out: Band) {
    quantize_rows(x, shape, out)
}

/// Every row of finite `x`, group by group, into `out`.
#[inline(always)]
fn quantize_rows(x: &[f32], shape: &RowShape, out: Band) {
    let (in_feat, pitch, gs) = (shape.in_feat, shape.pitch, shape.group_size);
    let num_groups = pitch / gs;
    if in_feat == 0 {
        // Every code, scale and sum stays 0: an all-zero group's.
        return;
    }
    let mut padded = vec![0.0f32; pitch];
    for (r, xr) in x.chunks_exact(in_feat).enumerate() {
        padded[..in_feat].copy_from_slice(xr);
        let qrow = &mut out.q[r * pitch..(r + 1) * pitch];
        for (g, (xs, qs)) in padded
            .chunks_exact(gs)
            .zip(qrow.chunks_exact_mut(gs))
            .enumerate()
        {
            let (d, sum) = quantize_group(xs, qs);
            out.d[r * num_groups + g] = d;
            out.sums[r * num_groups + g] = sum;
        }
    }
}

/// `1.5 * 2^23`: for `|t| <= 127`, `t + ROUNDER` lies in `[2^23, 2^24)`,
/// where the f32 spacing is 1, so the addition rounds `t` to an integer,
/// ties to even (the default rounding mode), and that integer is the
/// difference of the bit patterns. Plain operations the compiler
/// vectorizes: `f32::round_ties_even` is a library call on baseline x86_64
/// and the saturating `as i32` a branch per element, which made quantizing
/// `x` cost as much as the matvec.
const ROUNDER: f32 = 12_582_912.0;

/// One group: its scale and the sum of its codes (finite input).
#[inline(always)]
fn quantize_group(xs: &[f32], qs: &mut [i8]) -> (f32, i32) {
    // The largest |x| by its bits: for non-negative finite floats the
    // integer order is the float order (an integer max vectorizes, a float
    // max fold does not, lacking a NaN-free guarantee).
    let amax_bits = xs
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF));
    let d = f32::from_bits(amax_bits) / Q_MAX;
    if d < f32::MIN_POSITIVE {
        qs.fill(0);
        return (0.0, 0);
    }
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(xs) {
        // |v / d| <= 127 up to the division's rounding; the clamp keeps a
        // quotient a hair above it at 127.
        let t = (v / d).clamp(-Q_MAX, Q_MAX);
        let c = (t + ROUNDER).to_bits() as i32 - ROUNDER.to_bits() as i32;
        *q = c as i8;
        sum += c;
    }
    (d, sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{on_one_thread, rand_vec};

    /// The scheme of the module docs, written out per value in the plainest
    /// way (`round_ties_even`, a saturating clamp), as the reference.
    fn reference(x: &[f32], in_feat: usize, pitch: usize, gs: usize) -> (Vec<i8>, Vec<f32>) {
        let (mut q, mut d) = (Vec::new(), Vec::new());
        for row in x.chunks_exact(in_feat) {
            let mut padded = row.to_vec();
            padded.resize(pitch, 0.0);
            for g in padded.chunks_exact(gs) {
                let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let s = amax / Q_MAX;
                if s < f32::MIN_POSITIVE {
                    q.extend(std::iter::repeat_n(0i8, gs));
                    d.push(0.0);
                } else {
                    q.extend(
                        g.iter()
                            .map(|v| (v / s).clamp(-Q_MAX, Q_MAX).round_ties_even() as i8),
                    );
                    d.push(s);
                }
            }
        }
        (q, d)
    }

    /// Bands on the pool and the calling thread alone give the reference's
    /// codes, scales and sums, at row counts around the band size and the
    /// size from which the pool takes over, with a padded last group.
    #[test]
    fn bands_on_the_pool_match_the_reference_and_one_thread() {
        for (in_feat, gs) in [(576usize, 32usize), (577, 32), (200, 128)] {
            let pitch = in_feat.next_multiple_of(gs);
            let par_from = PAR_MIN_VALUES.div_ceil(in_feat);
            for rows in [
                1,
                BAND_ROWS - 1,
                BAND_ROWS + 1,
                par_from - 1,
                par_from,
                511,
                600,
            ] {
                let mut x = rand_vec(rows * in_feat, (rows * 7 + in_feat) as u64);
                // A zero group and a tiny one (stored as d = 0).
                x[..gs.min(in_feat)].fill(0.0);
                if rows > 1 {
                    x[in_feat..in_feat + gs.min(in_feat)].fill(1e-39);
                }
                let what = format!("rows {rows} in {in_feat} gs {gs}");
                for fast in [None, fast_token()] {
                    let got = Xq8::quantize(&x, rows, in_feat, pitch, gs, fast).unwrap();
                    let (q, d) = reference(&x, in_feat, pitch, gs);
                    assert_eq!(got.q, q, "{what}");
                    assert_eq!(got.d, d, "{what}");
                    let sums: Vec<i32> = q
                        .chunks_exact(gs)
                        .map(|g| g.iter().map(|&c| c as i32).sum())
                        .collect();
                    assert_eq!(got.sums, sums, "{what}");
                    let one = on_one_thread(|| Xq8::quantize(&x, rows, in_feat, pitch, gs, fast))
                        .unwrap();
                    assert_eq!((one.q, one.d, one.sums), (got.q, got.d, got.sums), "{what}");
                }
            }
        }
    }

    /// A NaN or infinity in any band is the error, naming its index.
    #[test]
    fn a_non_finite_value_in_any_band_is_an_error() {
        let (rows, in_feat) = (300, 576);
        for at in [0, BAND_ROWS * in_feat + 3, rows * in_feat - 1] {
            for bad in [f32::NAN, f32::NEG_INFINITY] {
                let mut x = rand_vec(rows * in_feat, 3);
                x[at] = bad;
                let e = Xq8::quantize(&x, rows, in_feat, in_feat, 32, fast_token()).unwrap_err();
                let want = format!("[{}, {}]", at / in_feat, at % in_feat);
                assert!(e.to_string().contains(&want), "{e} lacks {want}");
            }
        }
    }

    fn fast_token() -> Option<Fast> {
        #[cfg(target_arch = "x86_64")]
        return Avx2::at(crate::simd::detected());
        #[cfg(not(target_arch = "x86_64"))]
        None
    }
}
