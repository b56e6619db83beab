//! The forward engine shared by the linear layers: `y = (x . R^T) * s + b`
//! for a weight stored as rows `R [out, in]` in some compressed format.
//!
//! - Few batch rows (`m < TILE_MIN_ROWS`): every output row is one fused
//!   decode-and-dot over the stored row (SIMD per format; E4M3 rows on AVX2
//!   four at a time, `e4m3_rows.rs`), in tasks of output rows run by
//!   `crate::par::for_each_block` (the caller works at once, pool threads
//!   join as they wake). Each weight byte is read once per batch row,
//!   straight from memory: the batch-1 case is bound by the weight's size.
//! - Up to `GEMM_MIN_ROWS` batch rows: `for_each_block` over blocks of `RB`
//!   output rows; each task decodes a tile `[RB, KC]` of the weight into an
//!   f32 buffer that stays in cache and runs a 4x4 register-blocked dot
//!   micro-kernel over it for every batch row.
//! - Many batch rows: the INT4 blocked GEMM itself (`crate::int4::panel_gemm`:
//!   its tiles, task split, per-thread tile buffers and micro-kernels, which
//!   on AVX2 write `y` directly): each task decodes a tile of output rows by
//!   inputs into panels of `PANEL_WIDTH` output rows, input-major (the
//!   layout the micro-kernels broadcast `x` against), and runs every batch row
//!   of its block through an `MR x PANEL_WIDTH` FMA micro-kernel. E4M3 rows
//!   go from their codes to the panels in one pass (`Dots::e4m3_panel8`).
//!
//! Either way the weight is decoded once per call (per batch block) and never
//! materialized whole.
//!
//! Each output element is computed by one task in a fixed order, so results
//! do not depend on the thread count.

// Re-exported: the layers name the epilogue with `matmul_rows`, from here.
pub(crate) use super::common::Epilogue;
use super::common::OutPtr;
use super::dispatch::Dots;
use crate::int4::{panel_gemm, panel_stride, GemmKernels, PanelGemm, TileSpan, PANEL_WIDTH};

/// A weight stored as rows; values are "unscaled" (the layer's multiplier per
/// output row is applied after accumulation).
pub(crate) trait RowSource: Sync {
    /// Decode columns `k0 .. k0 + out.len()` of row `r` into `out`.
    fn decode(&self, r: usize, k0: usize, out: &mut [f32]);
    /// Dot product of the whole row `r` with `x` (`x.len()` = in), with the
    /// kernels `dots`.
    fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32;
    /// `out[i]` = the dot of row `r0 + i` with `x`: one [`RowSource::dot`]
    /// per row, unless the format has a kernel that serves several rows per
    /// pass over `x`.
    fn dot_rows(&self, dots: Dots, r0: usize, x: &[f32], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.dot(dots, r0 + i, x);
        }
    }
    /// The rows as E4M3 codes `[n, k]`, when that is what they are (the
    /// AMX path, `amx.rs`, decodes them itself).
    fn e4m3_codes(&self) -> Option<&[u8]> {
        None
    }
}

/// Output rows per `RowSource::dot_rows` call (one rayon task at most).
const DOT_ROWS: usize = 64;
/// Batch rows from which the tiled path is used.
const TILE_MIN_ROWS: usize = 4;
/// Output rows per tile (one rayon task).
const RB: usize = 16;
/// Columns per tile: 16 x 512 f32 = 32 KiB, the size of L1d.
const KC: usize = 512;
/// Batch rows from which the panel GEMM is used: its decode writes the
/// tile transposed, one scalar store per weight, which at 16 rows still
/// costs more than its micro-kernel saves (docs/benchmarks.md).
const GEMM_MIN_ROWS: usize = 32;
/// Inputs per GEMM tile on AVX-512 (the other levels take the INT4 GEMM's
/// balanced tiles, at most this deep): a panel is `GKC x PANEL_WIDTH` f32
/// = 32 KiB.
const GKC: usize = 256;
/// Output rows per GEMM tile on AVX-512 (one rayon task): four panels,
/// 128 KiB, in L2.
const GNC: usize = 128;

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
            matmul_rows_in_range(src, n, k, &xs, m, y, &unbiased);
            crate::range::unscale(y, n, &shifts);
            if let Some(b) = bias {
                y.chunks_exact_mut(n)
                    .for_each(|row| row.iter_mut().zip(b).for_each(|(v, bb)| *v += bb));
            }
            return;
        }
    }
    matmul_rows_in_range(src, n, k, x, m, y, epi);
}

/// [`matmul_rows`] without the range check of `x`, for an `x` known to be
/// in range: every finite `|x|` below `2^64` (`crate::range`; NaN and inf
/// are in range too: the check finds no shift for them). W8A8's
/// activations, rounded onto the E4M3 grid, are at most 448 in magnitude;
/// the check's pass over them was 1.4 % of a 64-row call on Zen 3 (under
/// 1 % at 512 rows), for a shift it can never find. An `x` outside the
/// range gives inf where the checked call is finite, never undefined
/// behaviour.
pub(crate) fn matmul_rows_in_range<S: RowSource>(
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
    #[cfg(target_arch = "x86_64")]
    if m >= super::amx::AMX_MIN_ROWS && k > 0 {
        if let (Some(tok), Some(codes)) = (crate::simd::Amx::new(), src.e4m3_codes()) {
            if super::amx::gemm_e4m3(tok, codes, n, k, x, m, y, epi) {
                return;
            }
        }
    }
    let dots = Dots::current();
    let out = OutPtr(y.as_mut_ptr());
    let b_at = |r: usize| bias.map_or(0.0, |b| b[r]);
    if m < TILE_MIN_ROWS || k == 0 {
        // Tasks of about 64 Ki weights, in calls of at most DOT_ROWS rows
        // (a multiple of 4, the rows per pass of the multi-row kernels).
        // Run by `par::for_each_block`, not a rayon `par_iter`: called from
        // Python's thread, rayon queues the job and puts the caller to sleep
        // until the pool is done, and that wake-up was most of a batch-1
        // call on a small layer (576 x 576: ~75 us of wall time for ~15 us
        // of work on Zen 3; docs/benchmarks.md, "What bounds the batch-1
        // FP8 forward"). Here the caller starts at once and helpers join
        // when they wake. Each output row is still summed by one task.
        let rows_per_task = ((1 << 16) / k.max(1) + 1).next_multiple_of(4);
        let chunk = rows_per_task.min(DOT_ROWS);
        // E4M3 rows where the level has the multi-row kernel: `x` scaled
        // once per call for it (`e4m3_rows.rs`: exact, and refused for an
        // `x` it would overflow).
        let e4m3 = src
            .e4m3_codes()
            .filter(|_| dots.has_e4m3_rows() && k > 0)
            .and_then(|codes| Some((codes, super::e4m3_rows::prescaled(x)?)));
        crate::par::for_each_block(n.div_ceil(chunk), |c| {
            let rows = c * chunk..((c + 1) * chunk).min(n);
            let mut v = [0f32; DOT_ROWS];
            let v = &mut v[..rows.len()];
            for b in 0..m {
                let xb = b * k..(b + 1) * k;
                let by_rows = e4m3.as_ref().is_some_and(|(codes, xs)| {
                    let block = &codes[rows.start * k..rows.end * k];
                    dots.e4m3_rows(block, k, &xs[xb.clone()], v)
                });
                if k > 0 && !by_rows {
                    src.dot_rows(dots, rows.start, &x[xb], v);
                }
                for (r, &vr) in rows.clone().zip(v.iter()) {
                    let o = out;
                    // SAFETY: element (b, r) is written by the task owning r only,
                    // and b * n + r < m * n = y.len().
                    unsafe { *o.0.add(b * n + r) = vr * scale(r) + b_at(r) };
                }
            }
        });
        return;
    }
    if m >= GEMM_MIN_ROWS {
        let gemm = GemmKernels::new(crate::simd::level()).unwrap_or(GemmKernels::Scalar);
        gemm_rows(src, n, k, x, m, y, &b_at, scale, gemm);
        return;
    }
    // `par::for_each_block` for the reason given at the batch-1 path.
    crate::par::for_each_block(n.div_ceil(RB), |blk| {
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

/// The panel GEMM of `matmul_rows` (`m >= GEMM_MIN_ROWS`, `k > 0`): the INT4
/// GEMM's driver (`crate::int4::panel_gemm`: its tiles, task split, tile
/// buffers and micro-kernels) with this format's rows decoded into its
/// panels (`panel[i * PANEL_WIDTH + c]` = input `i` of output row `c` of
/// the panel, rows past `n` zero); scale and bias are applied to each
/// finished block. Every element of `y` is summed by one task in input
/// order.
#[allow(clippy::too_many_arguments)]
fn gemm_rows<S: RowSource>(
    src: &S,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    y: &mut [f32],
    b_at: &(dyn Fn(usize) -> f32 + Sync),
    scale: &(dyn Fn(usize) -> f32 + Sync),
    gemm: GemmKernels,
) {
    let dots = Dots::current();
    let decode = |t: &TileSpan, packed: &mut [f32]| {
        // Eight weight rows decoded, then turned input-major together (one
        // scalar store per weight was the cost that kept this path behind
        // torch at M = 64); E4M3 rows in one pass from their codes where
        // the level has it (the table gather and the f32 copy of the rows
        // were a third of an FP8 prefill call on Zen 3). The f32 rows'
        // buffer only where some rows take that path: zeroing 8 KiB per
        // tile showed as 1.6 % of a 64-row E4M3 call, whose rows never
        // use it.
        let mut rows8_buf: Vec<f32> = Vec::new();
        for j in 0..t.nc.div_ceil(PANEL_WIDTH) {
            let panel = &mut packed[j * panel_stride(t.kc)..][..t.kc * PANEL_WIDTH];
            for c8 in (0..PANEL_WIDTH).step_by(8) {
                let r8 = t.c0 + j * PANEL_WIDTH + c8;
                if let Some(codes) = src.e4m3_codes().filter(|_| r8 + 8 <= t.c0 + t.nc) {
                    let rows = &codes[r8 * k + t.k0..];
                    if dots.e4m3_panel8(rows, k, t.kc, &mut panel[c8..], PANEL_WIDTH) {
                        continue;
                    }
                }
                if rows8_buf.is_empty() {
                    rows8_buf.resize(8 * t.kc, 0.0);
                }
                let rows8 = &mut rows8_buf[..];
                for (c, dst) in rows8.chunks_exact_mut(t.kc).enumerate() {
                    let r = t.c0 + j * PANEL_WIDTH + c8 + c;
                    if r < t.c0 + t.nc {
                        src.decode(r, t.k0, dst);
                    } else {
                        dst.fill(0.0);
                    }
                }
                dots.transpose8(rows8, t.kc, &mut panel[c8..], PANEL_WIDTH);
            }
        }
    };
    // Scales and biases once per call: through the `dyn Fn`s for every
    // element they took a tenth of a prefill call.
    let (scales, biases): (Vec<f32>, Vec<f32>) = (0..n).map(|r| (scale(r), b_at(r))).unzip();
    let finish = |c0: usize, row: &mut [f32]| {
        let (s, b) = (&scales[c0..c0 + row.len()], &biases[c0..c0 + row.len()]);
        for ((v, s), b) in row.iter_mut().zip(s).zip(b) {
            *v = *v * s + b;
        }
    };
    let g = PanelGemm {
        k,
        n,
        x,
        batch: m,
        kernels: gemm,
        avx512_tile: (GKC, GNC),
    };
    panel_gemm(&g, y, &decode, Some(&finish));
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
            (16, 35, 300),
            (17, 130, 513),
            (33, 33, 1100),
            (40, 1, 3),
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

    /// E4M3 codes as a row source that offers them to the panel decode.
    struct Codes<'a>(&'a [u8], usize);
    impl RowSource for Codes<'_> {
        fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
            let t = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
            for (o, &c) in out.iter_mut().zip(&self.0[r * self.1 + k0..]) {
                *o = t[c as usize];
            }
        }
        fn dot(&self, dots: Dots, r: usize, x: &[f32]) -> f32 {
            dots.e4m3(&self.0[r * self.1..(r + 1) * self.1], x)
        }
        fn e4m3_codes(&self) -> Option<&[u8]> {
            Some(self.0)
        }
    }

    /// The panel GEMM on E4M3 rows (their panels decoded straight from the
    /// codes where the level has it) against float64 sums of the table's
    /// values: output rows that are not a multiple of 8 or of the panel
    /// width, depths with a tail of 8 and more than one depth block; the
    /// same on one thread as on the pool.
    #[test]
    fn e4m3_panel_gemm_matches_f64_and_is_thread_independent() {
        // The last two split the batch into blocks (few panels, from 192
        // rows; `crate::int4::gemm_split`): odd M, N short of a panel.
        for (m, n, k) in [
            (32, 8, 8),
            (37, 41, 300),
            (64, 100, 577),
            (70, 33, 1031),
            (193, 45, 200),
            (301, 200, 130),
        ] {
            let w = codes(n * k, 21);
            let x = rng_vals(m * k, 22);
            check_e4m3_rows(&w, &x, &rng_vals(n, 23), (m, n, k), "");
        }
    }

    /// Batch 1-3 on E4M3 rows (the multi-row kernel of `e4m3_rows.rs`
    /// where the level has it, in groups of four rows plus the rest)
    /// against float64 sums of the table's values, for row counts that are
    /// not multiples of four or of a task's rows and depths with tails; an
    /// `x` with an element of 2^17 (which the kernel's scaled copy refuses:
    /// the per-row dot runs) gives the same within rounding; the same on one
    /// thread as on the pool.
    #[test]
    fn e4m3_few_rows_match_f64_and_are_thread_independent() {
        for (m, n, k) in [
            (1, 1, 1),
            (1, 7, 33),
            (2, 65, 577),
            (3, 130, 1100),
            (1, 203, 64),
        ] {
            let w = codes(n * k, 31);
            for big in [false, true] {
                let mut x = rng_vals(m * k, 32);
                if big {
                    x[k / 2] = 131072.0;
                }
                let what = if big { " (an |x| of 2^17)" } else { "" };
                check_e4m3_rows(&w, &x, &rng_vals(n, 33), (m, n, k), what);
            }
        }
    }

    /// W8A8's unchecked call equals the checked one bit for bit on inputs
    /// on the E4M3 grid (what `prepare_fp8` hands it: at most 448, with
    /// +-448, zeros, NaN and the smallest subnormal among them), on every
    /// path: batch-1 dots, the tiled path and the panel GEMM.
    #[test]
    fn in_range_call_equals_the_checked_one_on_grid_inputs() {
        for (m, n, k) in [(1, 9, 70), (5, 33, 130), (40, 45, 200), (64, 70, 577)] {
            let w = codes(n * k, 41);
            let mut x: Vec<f32> = rng_vals(m * k, 42)
                .iter()
                .map(|v| crate::linear::e4m3_round::round_e4m3_sat(v * 300.0))
                .collect();
            for (i, v) in [448.0, -448.0, 0.0, -0.0, 2f32.powi(-9)]
                .into_iter()
                .enumerate()
            {
                x[(i * 37) % (m * k)] = v;
            }
            if m > 1 {
                // NaN in the last row (the others stay finite).
                x[(m - 1) * k + 3] = f32::NAN;
            }
            let epi = Epilogue {
                scale: &|r| 0.25 + r as f32 / 8.0,
                bias: None,
            };
            let mut y = vec![f32::NAN; m * n];
            matmul_rows(&Codes(&w, k), n, k, &x, m, &mut y, &epi);
            let mut yu = vec![f32::NAN; m * n];
            matmul_rows_in_range(&Codes(&w, k), n, k, &x, m, &mut yu, &epi);
            for (i, (a, b)) in y.iter().zip(&yu).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "m={m} n={n} k={k} at {i}");
            }
            // Not vacuous: finite outputs off the NaN's row.
            assert!(y[..n].iter().all(|v| v.is_finite()) && y[..n].iter().any(|v| *v != 0.0));
        }
    }

    /// `matmul_rows` of the E4M3 codes `w` (`[n, k]`) with the row scales
    /// `0.25 + r / 8` and `bias`: the same bits on one thread as on the
    /// pool, and each output within `1e-5` of the float64 sum of the
    /// table's values (relative to the sum of the products' magnitudes).
    fn check_e4m3_rows(
        w: &[u8],
        x: &[f32],
        bias: &[f32],
        (m, n, k): (usize, usize, usize),
        what: &str,
    ) {
        let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        let epi = Epilogue {
            scale: &|r| 0.25 + r as f32 / 8.0,
            bias: Some(bias),
        };
        let mut y = vec![f32::NAN; m * n];
        matmul_rows(&Codes(w, k), n, k, x, m, &mut y, &epi);
        let mut y1 = vec![f32::NAN; m * n];
        crate::testutil::on_one_thread(|| matmul_rows(&Codes(w, k), n, k, x, m, &mut y1, &epi));
        assert_eq!(y, y1, "m={m} n={n} k={k}{what}: one thread vs the pool");
        for b in 0..m {
            for r in 0..n {
                let (mut s, mut mag) = (0f64, 0f64);
                for i in 0..k {
                    let p = f64::from(x[b * k + i]) * f64::from(table[w[r * k + i] as usize]);
                    s += p;
                    mag += p.abs();
                }
                let sc = 0.25 + r as f64 / 8.0;
                let want = s * sc + f64::from(bias[r]);
                let got = f64::from(y[b * n + r]);
                assert!(
                    (got - want).abs() <= 1e-5 * mag * sc + 1e-5,
                    "m={m} n={n} k={k}{what} ({b},{r}): {got} vs {want}"
                );
            }
        }
    }

    /// Signed zeros, subnormal and huge inputs through the AMX path (from
    /// `AMX_MIN_ROWS` E4M3 rows, where the CPU has it): the tile unit reads
    /// values below 2^-126 as zero (a documented absolute difference below
    /// `k * 448 * 2^-126`), and huge rows reach it scaled into range by
    /// `matmul_rows` (crate::range).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_path_takes_zeros_subnormals_and_huge_inputs() {
        if crate::simd::Amx::new().is_none() {
            eprintln!("skipped: no AMX here");
            return;
        }
        let table = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
        let (m, n, k) = (17, 40, 300);
        let w = codes(n * k, 5);
        let mut x: Vec<f32> = crate::testutil::rand_vec(m * k, 6)
            .iter()
            .map(|v| v * 2.0 - 1.0)
            .collect();
        for (i, v) in x.iter_mut().enumerate() {
            match i % 5 {
                0 => *v = -0.0,
                1 => *v *= 1e-40, // subnormal
                _ => {}
            }
        }
        x[3 * k..4 * k].iter_mut().for_each(|v| *v *= 3e37); // a huge row
        struct E4m3<'a>(&'a [u8], usize);
        impl RowSource for E4m3<'_> {
            fn decode(&self, r: usize, k0: usize, out: &mut [f32]) {
                let t = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
                for (o, &c) in out.iter_mut().zip(&self.0[r * self.1 + k0..]) {
                    *o = t[c as usize];
                }
            }
            fn dot(&self, _: Dots, r: usize, x: &[f32]) -> f32 {
                let t = crate::fp8::decode_table(crate::fp8::Fp8Format::E4M3);
                x.iter()
                    .zip(&self.0[r * self.1..])
                    .map(|(v, &c)| v * t[c as usize])
                    .sum()
            }
            fn e4m3_codes(&self) -> Option<&[u8]> {
                Some(self.0)
            }
        }
        let mut y = vec![f32::NAN; m * n];
        // The huge row's unscaled sums overflow f32; scaled by 2^-20 they do not.
        let epi = Epilogue {
            scale: &|_| 1.0 / 1048576.0,
            bias: None,
        };
        matmul_rows(&E4m3(&w, k), n, k, &x, m, &mut y, &epi);
        for b in 0..m {
            for r in 0..n {
                let (mut s, mut mag) = (0f64, 0f64);
                for i in 0..k {
                    let p = f64::from(x[b * k + i]) * f64::from(table[w[r * k + i] as usize]);
                    s += p;
                    mag += p.abs();
                }
                let (s, mag) = (s / 1048576.0, mag / 1048576.0);
                let got = f64::from(y[b * n + r]);
                let tol = 1e-6 * mag + k as f64 * 448.0 * 2f64.powi(-126);
                assert!(
                    got.is_finite() && (got - s).abs() <= tol,
                    "({b},{r}): {got} vs {s}"
                );
            }
        }
    }
}
