//! Blocked GEMM `Y = X W` over packed INT4 weights (batch >= 8).
//!
//! The classic three-level blocking (Goto & van de Geijn, "Anatomy of
//! high-performance matrix multiplication", 2008), with the packing step
//! replaced by dequantization: each rayon task owns a tile of `NC` output
//! columns (and a block of batch rows), dequantizes `KC` rows of that tile
//! into a panel-major f32 buffer that stays in L2 (`KC * NC * 4` = 256 KiB),
//! and runs an `MR x NR` FMA micro-kernel over every row of the batch. Each
//! weight is dequantized once per call, not once per batch row, and the full
//! f32 weight never exists.

use rayon::prelude::*;

use super::dispatch::Gemm;
use super::format::{panel_stride, TileArgs, NR};
use super::QuantizedWeightRef;

/// Depth of a dequantized tile (rows of W).
const KC: usize = 256;
/// Output columns per task tile (a multiple of NR).
const NC: usize = 256;
/// Size of a task's dequantized tile buffer.
const PACKED_LEN: usize = (NC / NR) * panel_stride(KC);
/// Largest micro-kernel height across levels.
const MR_MAX: usize = 12;

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

/// `y [batch, out_feat] = x [batch, in_feat] @ W`, sizes already checked.
pub(super) fn matmul(
    qw: &QuantizedWeightRef,
    x: &[f32],
    batch: usize,
    y: &mut [f32],
    kernels: Gemm,
) {
    let (k, n) = (qw.in_feat, qw.out_feat);
    debug_assert_eq!(x.len(), batch * k);
    debug_assert_eq!(y.len(), batch * n);
    let tiles_n = n.div_ceil(NC);
    // Enough tasks to keep every thread busy: split the batch when there are
    // few column tiles (each task then dequantizes its tile again, which is
    // cheap next to the FMAs it feeds).
    let want = 2 * rayon::current_num_threads().max(1);
    let b_blocks = if tiles_n >= want {
        1
    } else {
        want.div_ceil(tiles_n)
            .min(batch.div_ceil(kernels.mr()))
            .max(1)
    };
    let bb = batch.div_ceil(b_blocks).next_multiple_of(kernels.mr());
    let b_blocks = batch.div_ceil(bb);
    let yp = SendPtr(y.as_mut_ptr());
    let task = |packed: &mut Vec<f32>, t: usize| {
        let (tn, tb) = (t % tiles_n, t / tiles_n);
        let (c0, b0) = (tn * NC, tb * bb);
        let (nc, b1) = (NC.min(n - c0), (b0 + bb).min(batch));
        let mut out = [[0.0f32; NR]; MR_MAX];
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            let tile = TileArgs {
                data: qw.data,
                scales: qw.scales,
                out_feat: n,
                group_size: qw.group_size(),
                k0,
                kc,
                c0,
                nc,
            };
            kernels.dequant(&tile, packed);
            for j in 0..nc.div_ceil(NR) {
                let panel = &packed[j * panel_stride(kc)..][..kc * NR];
                let cj = c0 + j * NR;
                let ncols = NR.min(c0 + nc - cj);
                let mut b = b0;
                while b < b1 {
                    let m = kernels.mr().min(b1 - b);
                    let a = &x[b * k + k0..(b + m - 1) * k + k0 + kc];
                    kernels.micro(a, k, panel, kc, m, &mut out);
                    for (r, o) in out.iter().take(m).enumerate() {
                        // SAFETY: row b + r < batch and columns cj .. cj +
                        // ncols <= n lie in this task's block of y, which no
                        // other task writes (see SendPtr).
                        let yrow = unsafe {
                            std::slice::from_raw_parts_mut(yp.get().add((b + r) * n + cj), ncols)
                        };
                        if k0 == 0 {
                            yrow.copy_from_slice(&o[..ncols]);
                        } else {
                            for (yv, ov) in yrow.iter_mut().zip(o) {
                                *yv += ov;
                            }
                        }
                    }
                    b += m;
                }
            }
        }
    };
    let tasks = tiles_n * b_blocks;
    if tasks == 1 || (batch * k * n) < (1 << 20) {
        let mut packed = vec![0.0f32; PACKED_LEN];
        (0..tasks).for_each(|t| task(&mut packed, t));
    } else {
        (0..tasks)
            .into_par_iter()
            .for_each_init(|| vec![0.0f32; PACKED_LEN], task);
    }
}
