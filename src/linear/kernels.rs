//! The forward engine shared by the linear layers: `y = (x . R^T) * s + b`
//! for a weight stored as rows `R [out, in]` in some compressed format.
//!
//! - Few batch rows (`m < TILE_MIN_ROWS`): every output row is one fused
//!   decode-and-dot over the stored row (SIMD per format, rayon over output
//!   rows). Each weight byte is read once per batch row, straight from
//!   memory: the batch-1 case is bound by the weight's size.
//! - More batch rows: rayon over blocks of `RB` output rows; each task decodes
//!   a tile `[RB, KC]` of the weight into an f32 buffer that stays in cache and
//!   runs a 4x4 register-blocked dot micro-kernel over it for every batch row,
//!   so the weight is decoded once per call and never materialized whole.
//!
//! Each output element is computed by one task in a fixed order, so results
//! do not depend on the thread count.

use rayon::prelude::*;

use super::dispatch::Dots;

/// A weight stored as rows; values are "unscaled" (the layer's multiplier per
/// output row is applied after accumulation).
pub(crate) trait RowSource: Sync {
    /// Decode columns `k0 .. k0 + out.len()` of row `r` into `out`.
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]);
    /// Dot product of the whole row `r` with `x` (`x.len()` = in), with the
    /// kernels `dots`.
    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32;
}

/// Batch rows from which the tiled path is used.
const TILE_MIN_ROWS: usize = 4;
/// Output rows per tile (one rayon task).
const RB: usize = 16;
/// Columns per tile: 16 x 512 f32 = 32 KiB, the size of L1d.
const KC: usize = 512;

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint indices of one live buffer (see each use).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// What is applied to each finished dot product: `v * scale(r) + bias[r]`.
pub(crate) struct Epilogue<'a> {
    /// The multiplier of output row `r`.
    pub scale: &'a (dyn Fn(usize) -> f32 + Sync),
    /// The bias `[n]`, if any.
    pub bias: Option<&'a [f32]>,
}

/// `y[b, r] = dot(x[b], R[r]) * scale(r) + bias[r]` for `b < m`, `r < n`.
/// `x` is `[m, k]`, `y` is `[m, n]`, row-major.
pub(crate) fn matmul_rows<S: RowSource>(
    src: &S,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    epi: &Epilogue<'_>,
) {
    let (scale, bias) = (epi.scale, epi.bias);
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(y.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    // Rows of x so large that `x * code` sums would overflow before the scale
    // (crate::range): run them divided by a power of two, scale back, then
    // add the bias, so the result is what the unscaled sum would give.
    if k > 0 {
        if let Some(shifts) = crate::range::shifts(x, k) {
            let xs = crate::range::scaled(x, k, &shifts);
            let unbiased = Epilogue { scale, bias: None };
            matmul_rows(src, n, k, &xs, m, y, &unbiased);
            crate::range::unscale(y, n, &shifts);
            if let Some(b) = bias {
                y.chunks_exact_mut(n)
                    .for_each(|row| row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb));
            }
            return;
        }
    }
    let dots = Dots::current();
    let out = OutPtr(y.as_mut_ptr());
    let b_at = |r: usize| bias.map_or(0.0, |b| b[r]);
    if m < TILE_MIN_ROWS || k == 0 {
        let rows_per_task = (1 << 16) / k.max(1) + 1;
        (0..n)
            .into_par_iter()
            .with_min_len(rows_per_task)
            .for_each(|r| {
                let s = scale(r);
                for b in 0..m {
                    let v = if k == 0 {
                        0.0
                    } else {
                        src.dot(dots, r, &x[b * k..(b + 1) * k])
                    };
                    let o = out;
                    // SAFETY: element (b, r) is written by the task owning r only,
                    // and b * n + r < m * n = y.len().
                    unsafe { *o.0.add(b * n + r) = v * s + b_at(r) };
                }
            });
        return;
    }
    (0..n.div_ceil(RB)).into_par_iter().for_each(|blk| {
        let r0 = blk * RB;
        let rb = RB.min(n - r0);
        let mut acc = vec![0f32; m * rb];
        let mut tile = vec![0f32; RB * KC];
        let mut part = [[0f32; 4]; 4];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for j in 0..rb {
                src.decode(r0 + j, k0, &mut tile[j * kc..(j + 1) * kc]);
            }
            let mut b = 0;
            while b < m {
                let bm = 4.min(m - b);
                let mut j = 0;
                while j < rb {
                    let jm = 4.min(rb - j);
                    let xs: [&[f32]; 4] = std::array::from_fn(|i| {
                        let bi = b + i.min(bm - 1);
                        &x[bi * k + k0..bi * k + k0 + kc]
                    });
                    let ws: [&[f32]; 4] = std::array::from_fn(|i| {
                        let ji = j + i.min(jm - 1);
                        &tile[ji * kc..(ji + 1) * kc]
                    });
                    dots.dot4x4(&xs, &ws, &mut part);
                    for (bi, row) in part.iter().enumerate().take(bm) {
                        for (ji, &p) in row.iter().enumerate().take(jm) {
                            acc[(b + bi) * rb + j + ji] += p;
                        }
                    }
                    j += 4;
                }
                b += 4;
            }
        }
        for b in 0..m {
            for j in 0..rb {
                let r = r0 + j;
                let o = out;
                // SAFETY: rows r0..r0+rb belong to this task only, and
                // b * n + r < m * n = y.len().
                unsafe { *o.0.add(b * n + r) = acc[b * rb + j] * scale(r) + b_at(r) };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::format::{dot_e4m3_scalar, dot_f32_scalar, dot_i8_scalar};
    use crate::simd::{available_levels, SimdLevel};

    /// Values in [-2, 2).
    fn rng_vals(n: usize, seed: u64) -> Vec<f32> {
        crate::testutil::rand_vec(n, seed)
            .iter()
            .map(|v| v * 2.0)
            .collect()
    }

    fn codes(n: usize, seed: u64) -> Vec<u8> {
        rng_vals(n, seed)
            .iter()
            .map(|v| {
                let c = ((v + 2.0) * 64.0) as u8;
                if c & 0x7F == 0x7F {
                    c ^ 1
                } else {
                    c
                }
            })
            .collect()
    }

    fn close(a: f32, b: f32, scale: f32) -> bool {
        (a - b).abs() <= 1e-5 * scale + 1e-6
    }

    #[test]
    fn every_level_dot_matches_scalar() {
        if available_levels() == [SimdLevel::Scalar] {
            eprintln!("skipped: no SIMD level in force here (CPU or QUANTRS_SIMD)");
            return;
        }
        let t = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        for n in [0, 1, 7, 16, 31, 33, 64, 100, 1027] {
            let x = rng_vals(n, n as u64 + 1);
            let c = codes(n, n as u64 + 2);
            let q: Vec<i8> = c.iter().map(|&v| v as i8).collect();
            let w = rng_vals(n, n as u64 + 3);
            let mag = |f: &dyn Fn(usize) -> f32| (0..n).map(|i| (f(i) * x[i]).abs()).sum::<f32>();
            let (sc, sq, sw) = (
                mag(&|i| t[c[i] as usize]),
                mag(&|i| q[i] as f32),
                mag(&|i| w[i]),
            );
            for level in available_levels() {
                let dots = Dots::at(level).unwrap();
                assert!(
                    close(dots.e4m3(&c, &x), dot_e4m3_scalar(&c, &x), sc),
                    "{level:?} e4m3 n={n}"
                );
                assert!(
                    close(dots.i8(&q, &x), dot_i8_scalar(&q, &x), sq),
                    "{level:?} i8 n={n}"
                );
                assert!(
                    close(dots.f32(&w, &x), dot_f32_scalar(&w, &x), sw),
                    "{level:?} f32 n={n}"
                );
                let xs = [&x[..], &w[..], &x[..], &w[..]];
                let mut part = [[0f32; 4]; 4];
                dots.dot4x4(&xs, &xs, &mut part);
                for i in 0..4 {
                    for j in 0..4 {
                        let want = dot_f32_scalar(xs[i], xs[j]);
                        assert!(
                            close(part[i][j], want, sw.max(sc) * 4.0 + 8.0 * n as f32),
                            "{level:?} 4x4"
                        );
                    }
                }
            }
        }
    }

    struct F32Rows<'a>(&'a [f32], usize);
    impl RowSource for F32Rows<'_> {
        fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
            let s = r * self.1 + k0;
            out.copy_from_slice(&self.0[s..s + out.len()]);
        }
        fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
            dots.f32(&self.0[r * self.1..(r + 1) * self.1], x)
        }
    }

    #[test]
    fn matmul_rows_matches_f64_on_tails() {
        for (m, n, k) in [
            (1, 1, 1),
            (1, 17, 33),
            (3, 5, 600),
            (4, 16, 512),
            (9, 35, 1100),
            (5, 3, 7),
        ] {
            let w = rng_vals(n * k, 11);
            let x = rng_vals(m * k, 12);
            let bias = rng_vals(n, 13);
            let mut y = vec![0f32; m * n];
            let epi = Epilogue {
                scale: &|r| 0.5 + r as f32,
                bias: Some(&bias),
            };
            matmul_rows(&F32Rows(&w, k), n, k, &x, m, &mut y, &epi);
            for b in 0..m {
                for r in 0..n {
                    let mut s = 0f64;
                    let mut mag = 0f64;
                    for i in 0..k {
                        s += x[b * k + i] as f64 * w[r * k + i] as f64;
                        mag += (x[b * k + i] as f64 * w[r * k + i] as f64).abs();
                    }
                    let want = s * (0.5 + r as f64) + bias[r] as f64;
                    let got = y[b * n + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag * (0.5 + r as f64) + 1e-5,
                        "m={m} n={n} k={k} ({b},{r})"
                    );
                }
            }
        }
    }
}
