//! Blocked GEMM `Y = X W` over packed INT4 weights (batch >= 8).
//!
//! The classic three-level blocking (Goto & van de Geijn, "Anatomy of
//! high-performance matrix multiplication", 2008), with the packing step
//! replaced by dequantization: each rayon task owns a tile of output
//! columns (and a block of batch rows), dequantizes a block of rows of that
//! tile into a panel-major f32 buffer that stays in L2, and runs an
//! `MR x NR` FMA micro-kernel over every row of the batch. Each weight is
//! dequantized once per call (per batch block), not once per batch row, and
//! the full f32 weight never exists.
//!
//! The block sizes depend on the shape only (never on the thread count), so
//! every output is summed in the same order on any number of threads.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::dispatch::Gemm;
use super::format::{panel_stride, TileArgs, NR};
use super::gemm_split::{task_grid, TaskGrid};
use super::QuantizedWeightRef;

/// Largest depth of a dequantized tile (rows of W).
const KC: usize = 256;
/// Largest AVX2 depth: a panel of `192 x NR` f32 is 24 KiB, which leaves
/// room in a 32 KiB L1d for the three rows of `x` the micro-kernel reads,
/// so the panel stays in L1 across the batch (at 256 rows it is the whole
/// L1 and is refetched from L2 by every micro-kernel call).
const KC_AVX2: usize = 192;
/// Most output columns per task tile (a multiple of NR).
const NC: usize = 256;
/// Size of a task's tile buffer (INT4's largest tile; the buffer grows if
/// a format asks for more).
const PACKED_LEN: usize = (NC / NR) * panel_stride(KC);
/// Largest micro-kernel height across levels.
const MR_MAX: usize = 12;

thread_local! {
    /// Each thread's tile buffer, kept across calls (rayon's workers live
    /// as long as the pool): a fresh zeroed 264 KiB per task and call
    /// showed in profiles of small prefill calls.
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A raw pointer that may cross threads; tasks write disjoint blocks of `y`.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: every task writes a block of `y` (its own output columns and batch
// rows) that no other task touches, and `matmul` outlives all tasks.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// A method (not field access) so closures capture the whole wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// How the `len` rows or columns of one dimension are cut into blocks of at
/// most `max`, all of one size (a multiple of `unit`, the last one
/// shorter): `len = 576, max = 256` gives three blocks of 192, not
/// 256 + 256 + 64, which balances the tasks and the micro-kernel calls.
fn balanced(len: usize, max: usize, unit: usize) -> usize {
    let blocks = len.div_ceil(max).max(1);
    len.div_ceil(blocks).next_multiple_of(unit).min(max)
}

/// The tile depth and width for `kernels` (AVX-512 keeps the fixed tiles
/// each format was tuned with, `avx512`).
fn tile_shape(kernels: Gemm, k: usize, n: usize, avx512: (usize, usize)) -> (usize, usize) {
    match kernels {
        #[cfg(target_arch = "x86_64")]
        Gemm::Avx512(_) => avx512,
        #[cfg(target_arch = "x86_64")]
        Gemm::Avx2(_) => (balanced(k, KC_AVX2, 16), balanced(n, NC, NR)),
        Gemm::Scalar => (balanced(k, KC, 16), balanced(n, NC, NR)),
    }
}

/// Whether `kernels` are AVX-512's.
fn is_avx512(kernels: Gemm) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Gemm::Avx512(_) = kernels {
        return true;
    }
    let _ = kernels;
    false
}

/// The task grid AVX-512 was tuned with, kept as it is: its fixed tiles,
/// and the batch split until there are twice as many tasks as threads (the
/// results do not depend on it: only the depth blocks set the order of each
/// output's sum).
fn avx512_grid(n: usize, batch: usize, cols: usize, kernels: Gemm) -> TaskGrid {
    let want = 2 * rayon::current_num_threads().max(1);
    let col_tasks = n.div_ceil(cols);
    let b_blocks = if col_tasks >= want {
        1
    } else {
        want.div_ceil(col_tasks)
            .min(batch.div_ceil(kernels.mr()))
            .max(1)
    };
    let rows = batch.div_ceil(b_blocks).next_multiple_of(kernels.mr());
    TaskGrid {
        cols,
        rows,
        col_tasks,
        row_tasks: batch.div_ceil(rows),
    }
}

/// A block of W that [`panel_gemm`] asks its format to decode: rows `k0 ..
/// k0 + kc`, output columns `c0 .. c0 + nc`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileSpan {
    /// First row of W (a multiple of the tile depth).
    pub k0: usize,
    /// Rows in the tile.
    pub kc: usize,
    /// First output column (a multiple of `NR`).
    pub c0: usize,
    /// Columns in the tile.
    pub nc: usize,
}

/// The shape-only inputs of [`panel_gemm`]: `x [batch, k]` times a weight
/// of `k` rows and `n` output columns.
pub(crate) struct PanelGemm<'a> {
    /// Rows of W (inputs).
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// The batch, `[batch, k]` row-major.
    pub x: &'a [f32],
    /// Rows of `x`.
    pub batch: usize,
    /// The micro-kernels of the level in force.
    pub kernels: Gemm,
    /// The tile (depth, width) on AVX-512, which each format keeps as it
    /// was tuned there; the other levels take balanced tiles.
    pub avx512_tile: (usize, usize),
}

/// Decodes one [`TileSpan`] into panels: panel `j` (columns `c0 + j * NR
/// ..`, `NR` wide, columns past the tile zero) at `j * panel_stride(kc)`,
/// input-major (`panel[i * NR + c]` = row `k0 + i`, column `c`).
pub(crate) type DecodeTile<'a> = dyn Fn(&TileSpan, &mut [f32]) + Sync + 'a;
/// Applied once to each finished block of `y`: `(c0, y[b, c0 .. c0 + nc])`
/// for every batch row `b` of a task (a format's per-column scale and bias).
pub(crate) type FinishRow<'a> = dyn Fn(usize, &mut [f32]) + Sync + 'a;

/// `y [batch, out_feat] = x [batch, in_feat] @ W`, sizes already checked.
pub(super) fn matmul(
    qw: &QuantizedWeightRef,
    x: &[f32],
    batch: usize,
    y: &mut [f32],
    kernels: Gemm,
) {
    debug_assert_eq!(y.len(), batch * qw.out_feat);
    with_int4_tiles(qw, x, batch, kernels, |g, dequant| {
        panel_gemm(g, y, dequant, None)
    });
}

/// [`matmul`] into an uninitialized `y` (see [`panel_gemm_uninit`]): every
/// element is written on return.
pub(super) fn matmul_uninit(
    qw: &QuantizedWeightRef,
    x: &[f32],
    batch: usize,
    y: &mut [MaybeUninit<f32>],
    kernels: Gemm,
) {
    debug_assert_eq!(y.len(), batch * qw.out_feat);
    with_int4_tiles(qw, x, batch, kernels, |g, dequant| {
        panel_gemm_uninit(g, y, dequant, None)
    });
}

/// The shape and the INT4 tile decoder of a call, handed to `run`.
fn with_int4_tiles(
    qw: &QuantizedWeightRef,
    x: &[f32],
    batch: usize,
    kernels: Gemm,
    run: impl FnOnce(&PanelGemm, &DecodeTile),
) {
    let (k, n) = (qw.in_feat, qw.out_feat);
    debug_assert_eq!(x.len(), batch * k);
    let dequant = |s: &TileSpan, packed: &mut [f32]| {
        let tile = TileArgs {
            data: qw.data,
            scales: qw.scales,
            out_feat: n,
            group_size: qw.group_size(),
            k0: s.k0,
            kc: s.kc,
            c0: s.c0,
            nc: s.nc,
        };
        kernels.dequant(&tile, packed);
    };
    let g = PanelGemm {
        k,
        n,
        x,
        batch,
        kernels,
        avx512_tile: (KC, NC),
    };
    run(&g, &dequant);
}

/// The blocked GEMM over a weight that `decode` turns into panels tile by
/// tile (INT4 here, the linear layers' formats in `crate::linear`): `y =
/// x @ W`, then `finish` on every block of `y`. Each output is summed in
/// depth-block order by one task, so `y` is the same on any thread count.
pub(crate) fn panel_gemm(
    g: &PanelGemm,
    y: &mut [f32],
    decode: &DecodeTile,
    finish: Option<&FinishRow>,
) {
    assert!(y.len() >= g.batch * g.n);
    // SAFETY: `y` holds `batch * n` initialized floats that nothing else
    // accesses while the exclusive borrow lasts.
    unsafe { panel_gemm_raw(g, SendPtr(y.as_mut_ptr()), decode, finish) }
}

/// [`panel_gemm`] into an output that need not be initialized: a new
/// array's allocation without the serial pass that zeroes it (1.7 % of a
/// one-thread INT4 call at M = 512 on Zen 3). The first depth block of
/// every task overwrites each element of its block before anything reads
/// it, so on return every element of `y[.. batch * n]` is initialized.
pub(crate) fn panel_gemm_uninit(
    g: &PanelGemm,
    y: &mut [MaybeUninit<f32>],
    decode: &DecodeTile,
    finish: Option<&FinishRow>,
) {
    assert!(y.len() >= g.batch * g.n);
    if g.k == 0 {
        // No depth block writes `y`: the empty sum, then `finish` on it.
        y[..g.batch * g.n].fill(MaybeUninit::new(0.0));
    }
    // SAFETY: `y` holds `batch * n` floats that nothing else accesses while
    // the exclusive borrow lasts; where k > 0 the core writes each element
    // before it reads it (the first depth block overwrites, see
    // `panel_gemm_raw`), and where k == 0 they were zeroed above.
    unsafe { panel_gemm_raw(g, SendPtr(y.as_mut_ptr().cast()), decode, finish) }
}

/// The core of [`panel_gemm`] on `y` as a raw pointer.
///
/// # Safety
/// `y` must point to `batch * n` floats that no one else accesses during the
/// call. They need not be initialized where `k > 0`: the first depth block
/// (`k0 == 0`) of each task stores every element of the task's block
/// before any read of it (the direct micro-kernel without `accumulate`, a
/// copy on the staged path).
unsafe fn panel_gemm_raw(
    g: &PanelGemm,
    yp: SendPtr,
    decode: &DecodeTile,
    finish: Option<&FinishRow>,
) {
    let (k, n, x, batch, kernels) = (g.k, g.n, g.x, g.batch, g.kernels);
    assert!(x.len() >= batch * k);
    if batch == 0 || n == 0 {
        return;
    }
    let (kc_max, nc_widest) = tile_shape(kernels, k, n, g.avx512_tile);
    let grid = if is_avx512(kernels) {
        avx512_grid(n, batch, nc_widest, kernels)
    } else {
        // Shape-only tasks, enough to balance the threads (see
        // `gemm_split`): narrower column tiles first (every weight still
        // decoded once), then the batch split into blocks.
        task_grid(n, batch, NR, nc_widest, kernels.mr())
    };
    let (nc_max, bb, tiles_n) = (grid.cols, grid.rows, grid.col_tasks);
    let task = |packed: &mut Vec<f32>, t: usize| {
        let need = nc_max.div_ceil(NR) * panel_stride(kc_max);
        if packed.len() < need {
            packed.resize(need.max(PACKED_LEN), 0.0);
        }
        let (tn, tb) = (t % tiles_n, t / tiles_n);
        let (c0, b0) = (tn * nc_max, tb * bb);
        let (nc, b1) = (nc_max.min(n - c0), (b0 + bb).min(batch));
        let mut out = [[0.0f32; NR]; MR_MAX];
        // `max(1)`: a depth of 0 has no block (and `step_by` no step of 0).
        for k0 in (0..k).step_by(kc_max.max(1)) {
            let kc = kc_max.min(k - k0);
            decode(&TileSpan { k0, kc, c0, nc }, packed);
            for j in 0..nc.div_ceil(NR) {
                let panel = &packed[j * panel_stride(kc)..][..kc * NR];
                let cj = c0 + j * NR;
                let ncols = NR.min(c0 + nc - cj);
                let mut b = b0;
                while b < b1 {
                    let m = kernels.mr().min(b1 - b);
                    let a = &x[b * k + k0..(b + m - 1) * k + k0 + kc];
                    // SAFETY: rows b .. b + m < batch and columns cj .. cj +
                    // ncols <= n lie in this task's block of y, which no
                    // other task reads or writes (see SendPtr).
                    let direct = unsafe {
                        let at = YAt {
                            y: yp,
                            at: b * n + cj,
                            ldy: n,
                            accumulate: k0 > 0,
                        };
                        micro_into_y(kernels, a, k, panel, kc, m, ncols, at)
                    };
                    if !direct {
                        kernels.micro(a, k, panel, kc, m, &mut out);
                        for (r, o) in out.iter().take(m).enumerate() {
                            let at = (b + r) * n + cj;
                            if k0 == 0 {
                                // A copy through the pointer, no slice: the
                                // element may not be initialized yet.
                                // SAFETY: as above; `o` holds NR >= ncols.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        o.as_ptr(),
                                        yp.get().add(at),
                                        ncols,
                                    )
                                };
                            } else {
                                // SAFETY: as above, and written by the
                                // first depth block.
                                let yrow = unsafe {
                                    std::slice::from_raw_parts_mut(yp.get().add(at), ncols)
                                };
                                for (yv, ov) in yrow.iter_mut().zip(o) {
                                    *yv += ov;
                                }
                            }
                        }
                    }
                    b += m;
                }
            }
        }
        if let Some(f) = finish {
            for b in b0..b1 {
                // SAFETY: as above, this task's columns c0 .. c0 + nc of
                // batch row b, all written by the depth blocks (or zeroed
                // by the caller where k == 0).
                let yrow = unsafe { std::slice::from_raw_parts_mut(yp.get().add(b * n + c0), nc) };
                f(c0, yrow);
            }
        }
    };
    let with_buffer = |t: usize| {
        PACKED.with(|p| match p.try_borrow_mut() {
            Ok(mut packed) => task(&mut packed, t),
            // Only if a task ran inside another on this thread (a caller
            // already inside a task): a buffer of its own.
            Err(_) => task(&mut Vec::new(), t),
        })
    };
    let tasks = grid.tasks();
    if tasks == 1 || (batch * k * n) < (1 << 20) {
        (0..tasks).for_each(with_buffer);
    } else {
        // `par::for_each_block`, not a rayon `par_iter`: called from
        // Python's thread, rayon queues the job and puts the caller to sleep
        // until the pool is done; here the caller starts on the first task at
        // once and the helpers take tasks as they wake. On a 2-thread Zen 3
        // a 576 -> 576 call at M = 64 went from 0.51 to 0.32 ms (best of 21).
        // Which thread runs a task does not change what it computes.
        crate::par::for_each_block(tasks, with_buffer);
    }
}

/// Where [`micro_into_y`] writes: element `at` of `y` (row stride `ldy`),
/// overwritten at the first depth block and added to after it.
#[derive(Clone, Copy)]
struct YAt {
    y: SendPtr,
    at: usize,
    ldy: usize,
    accumulate: bool,
}

/// The AVX2 micro-kernel straight on `y` for a full panel (`ncols == NR`):
/// `m` rows of `y` at `y_at`, with no staging buffer. Returns false
/// (nothing done) where this does not apply.
///
/// # Safety
/// `y` must hold rows `at / ldy .. + m` with `NR` floats each from `at`,
/// which no other thread accesses during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn micro_into_y(
    kernels: Gemm,
    a: &[f32],
    lda: usize,
    panel: &[f32],
    kc: usize,
    m: usize,
    ncols: usize,
    y_at: YAt,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Gemm::Avx2(t) = kernels {
        if ncols != NR {
            return false;
        }
        assert!((1..=3).contains(&m) && panel.len() >= kc * NR && a.len() >= (m - 1) * lda + kc);
        // SAFETY: the token proves the features; `a` and `panel` hold what
        // the kernel reads (asserted above) and `y` the rows it writes (the
        // caller's contract).
        unsafe {
            let (yp, ldy, acc) = (y_at.y.get().add(y_at.at), y_at.ldy, y_at.accumulate);
            match m {
                3 => super::avx2::gemm_micro_into::<3>(t, a, lda, panel, kc, yp, ldy, acc),
                2 => super::avx2::gemm_micro_into::<2>(t, a, lda, panel, kc, yp, ldy, acc),
                _ => super::avx2::gemm_micro_into::<1>(t, a, lda, panel, kc, yp, ldy, acc),
            }
        }
        return true;
    }
    let _ = (kernels, a, lda, panel, kc, m, ncols, y_at);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int4::QuantizedWeight;
    use crate::simd::{available_levels, SimdLevel};
    use crate::testutil::{on_one_thread, rand_vec};

    #[test]
    fn balanced_blocks() {
        assert_eq!(balanced(576, 256, 32), 192);
        assert_eq!(balanced(1536, 256, 32), 256);
        assert_eq!(balanced(576, 192, 16), 192);
        assert_eq!(balanced(1536, 192, 16), 192);
        assert_eq!(balanced(600, 256, 32), 224);
        assert_eq!(balanced(5, 192, 16), 16);
        assert_eq!(balanced(4096, 192, 16), 192);
    }

    /// Into a buffer of garbage (NaN, what an unwritten element would
    /// show), the uninitialized-output GEMM writes every element, bit for
    /// bit what the GEMM into a zeroed `y` gives, on every level: partial
    /// panels, batches of 3k + 1 rows, a batch split into blocks, depths
    /// that the tiles do not divide.
    #[test]
    fn uninit_output_is_fully_written_and_equals_the_zeroed_one() {
        for (i, &(k, n, gs, b)) in [
            (576, 192, 32, 64),
            (576, 200, 128, 37),
            (1537, 70, 32, 20),
            (160, 45, 32, 193),
            (576, 200, 32, 301),
        ]
        .iter()
        .enumerate()
        {
            let w = rand_vec(k * n, 60 + i as u64);
            let x = rand_vec(b * k, 70 + i as u64);
            let qw = QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap();
            let qr = qw.view();
            for level in available_levels() {
                let g = Gemm::new(level).unwrap();
                let mut y = vec![0.0f32; b * n];
                matmul(&qr, &x, b, &mut y, g);
                let mut yu = vec![MaybeUninit::new(f32::NAN); b * n];
                matmul_uninit(&qr, &x, b, &mut yu, g);
                for (j, (u, z)) in yu.iter().zip(&y).enumerate() {
                    // SAFETY: made initialized (NaN) above.
                    let u = unsafe { u.assume_init() };
                    assert_eq!(u.to_bits(), z.to_bits(), "{level:?} [{k}x{n}] b {b} at {j}");
                }
            }
        }
    }

    /// `panel_gemm_uninit` with a per-block `finish`, against float64 over a
    /// plain f32 weight decoded straight into the panels: `finish` sees the
    /// finished sums (not garbage), and a depth of 0 gives `finish` of 0.
    #[test]
    fn uninit_panel_gemm_finishes_written_blocks_and_empty_sums() {
        for &(k, n, b) in &[(0usize, 40usize, 10usize), (200, 70, 31), (400, 33, 100)] {
            let w = rand_vec(k * n, 80);
            let x = rand_vec(b * k, 81);
            let decode = |t: &TileSpan, packed: &mut [f32]| {
                for j in 0..t.nc.div_ceil(NR) {
                    let panel = &mut packed[j * panel_stride(t.kc)..][..t.kc * NR];
                    for i in 0..t.kc {
                        for c in 0..NR {
                            let col = t.c0 + j * NR + c;
                            panel[i * NR + c] = if col < t.c0 + t.nc {
                                w[(t.k0 + i) * n + col]
                            } else {
                                0.0
                            };
                        }
                    }
                }
            };
            let finish = |c0: usize, row: &mut [f32]| {
                for (c, v) in row.iter_mut().enumerate() {
                    *v = 2.0 * *v + (c0 + c) as f32;
                }
            };
            for level in available_levels() {
                let g = PanelGemm {
                    k,
                    n,
                    x: &x,
                    batch: b,
                    kernels: Gemm::new(level).unwrap(),
                    avx512_tile: (KC, NC),
                };
                let mut y = vec![MaybeUninit::new(f32::NAN); b * n];
                panel_gemm_uninit(&g, &mut y, &decode, Some(&finish));
                for r in 0..b {
                    for o in 0..n {
                        let (mut exact, mut mag) = (0.0f64, 0.0f64);
                        for j in 0..k {
                            let t = x[r * k + j] as f64 * w[j * n + o] as f64;
                            exact += t;
                            mag += t.abs();
                        }
                        let want = 2.0 * exact + o as f64;
                        // SAFETY: made initialized (NaN) above.
                        let got = unsafe { y[r * n + o].assume_init() } as f64;
                        let what = format!("{level:?} k {k} n {n} y[{r}, {o}] = {got}");
                        assert!((got - want).abs() <= 2e-5 * mag + 1e-4, "{what}");
                    }
                }
            }
        }
    }

    /// Prefill-sized GEMMs on every level against float64 (the bound of
    /// docs/int4.md), the same on one thread as on the pool, and within
    /// float32 rounding of the scalar level; shapes with partial panels,
    /// an odd depth and depth blocks that do not divide `in_feat`.
    #[test]
    fn prefill_gemm_matches_f64_and_is_thread_independent() {
        for (i, &(k, n, gs, b)) in [
            (576, 576, 32, 64),
            (576, 200, 128, 37),
            (1537, 70, 32, 20),
            (130, 600, 2, 65),
            // Few panels and a batch split into blocks (`gemm_split`):
            // odd M, N short of a panel.
            (160, 45, 32, 193),
            (576, 200, 32, 301),
        ]
        .iter()
        .enumerate()
        {
            let w = rand_vec(k * n, 40 + i as u64);
            let x = rand_vec(b * k, 50 + i as u64);
            let qw = QuantizedWeight::quantize_grouped(&w, k, n, gs).unwrap();
            let wd = qw.dequantize();
            let mut y_ref = vec![f32::NAN; b * n];
            qw.matmul_with(&x, b, &mut y_ref, SimdLevel::Scalar, true)
                .unwrap();
            for level in available_levels() {
                let mut y = vec![f32::NAN; b * n];
                qw.matmul_with(&x, b, &mut y, level, true).unwrap();
                let mut y1 = vec![f32::NAN; b * n];
                on_one_thread(|| qw.matmul_with(&x, b, &mut y1, level, true)).unwrap();
                assert_eq!(y, y1, "{level:?} [{k}x{n}] b {b}: one thread vs the pool");
                for r in 0..b {
                    for o in 0..n {
                        let (mut exact, mut mag) = (0.0f64, 0.0f64);
                        for j in 0..k {
                            let t = x[r * k + j] as f64 * wd[j * n + o] as f64;
                            exact += t;
                            mag += t.abs();
                        }
                        let got = y[r * n + o];
                        let what = format!("{level:?} [{k}x{n}] gs {gs} y[{r}, {o}]");
                        assert!((got as f64 - exact).abs() <= 1e-5 * mag + 1e-6, "{what}");
                        let s = y_ref[r * n + o];
                        // Both within the bound of the exact sum: within
                        // twice it of each other (the orders of the f32
                        // additions differ).
                        assert!(
                            ((got - s).abs() as f64) <= 2e-5 * mag + 2e-6,
                            "{what} vs scalar"
                        );
                    }
                }
            }
        }
    }
}
