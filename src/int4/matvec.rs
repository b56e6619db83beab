//! `y = W^T x` straight from the packed nibbles, never materializing the f32
//! weight. The work is cut into pieces fixed by the shape alone (column
//! chunks, or for tall matrices blocks of input rows with one partial output
//! each, added in block order) and run by [`crate::par::for_each_block`]
//! (the calling thread plus pool helpers), so every output's summation order
//! (and so its value) is the same for any thread count.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::dispatch::Matvec;
use super::format::{MatvecArgs, HI_SCALE, LO_SCALE};
use super::xint::XInt;
use super::QuantizedWeightRef;
use crate::par;

/// Fewer weights than this run on the calling thread.
pub(super) const PAR_MIN_WEIGHTS: usize = 1 << 18;

/// `y = W^T x` for one row `x` `[in_feat]` into `y` `[out_feat]`.
pub(super) fn matvec(qw: &QuantizedWeightRef, x: &[f32], y: &mut [f32], kernel: Matvec) {
    let in_padded = qw.in_padded();
    let n = qw.out_feat;
    // The layout itself holds by construction (private fields, checked
    // constructors); the callers check the lengths of `x` and `y`.
    debug_assert!(x.len() == qw.in_feat && y.len() == n);
    let mut xp = vec![0.0f32; in_padded];
    xp[..qw.in_feat].copy_from_slice(x);
    let xs = prescaled(&xp, kernel);
    // The VNNI kernel's integer `x` is built by the first work item that
    // needs it, not before the helpers are asked: the build then overlaps
    // the helpers' wake-up instead of delaying it.
    let xint_cell: OnceLock<Option<XInt>> = OnceLock::new();
    let xint_of = || -> Option<&XInt> {
        xint_cell
            .get_or_init(|| kernel.xint(&xp, qw.group_size()))
            .as_ref()
    };
    let args = MatvecArgs {
        data: qw.data,
        scales: qw.scales,
        x: &xp,
        xs: &xs,
        out_feat: qw.out_feat,
        group_size: qw.group_size(),
        groups: 0..qw.num_groups,
    };
    let weights = in_padded * n;
    if weights < PAR_MIN_WEIGHTS {
        kernel.cols(&args, xint_of(), 0, y);
    } else if qw.num_groups >= K_BLOCKS {
        // Split the input rows: each task streams one contiguous block of
        // the packed data (what DRAM and the prefetchers like best) into a
        // partial y; the partials are added in block order. The split
        // depends only on the shape, so results do not depend on threads.
        let per_block = qw.num_groups.div_ceil(K_BLOCKS);
        let blocks = qw.num_groups.div_ceil(per_block);
        let mut scratch = Scratch::take(blocks * n);
        let partial = scratch.get();
        // Work items: each block's columns in COL_PARTS pieces, small
        // enough that a helper joining late still gets its share.
        let width = n.div_ceil(COL_PARTS).next_multiple_of(128);
        let parts = n.div_ceil(width);
        let slots: Vec<(usize, usize, Mutex<&mut [f32]>)> = partial
            .chunks_mut(n)
            .enumerate()
            .flat_map(|(b, pb)| {
                pb.chunks_mut(width)
                    .enumerate()
                    .map(move |(c, ys)| (b, c * width, Mutex::new(ys)))
            })
            .collect();
        // The item that finishes the last block of a column piece adds that
        // piece's partials into `y` in block order (which thread does it
        // varies, the order does not): the reduction runs in parallel with
        // the other pieces instead of after all of them on the caller.
        let y_parts: Vec<Mutex<&mut [f32]>> = y.chunks_mut(width).map(Mutex::new).collect();
        let done: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
        par::for_each_block(slots.len(), |i| {
            let (b, c0, ref ys) = slots[i];
            let g0 = b * per_block;
            let mut block_args = args.clone();
            block_args.groups = g0..(g0 + per_block).min(qw.num_groups);
            kernel.cols(&block_args, xint_of(), c0, &mut lock(ys));
            let c = c0 / width;
            if done[c].fetch_add(1, Ordering::AcqRel) + 1 == blocks {
                let mut yc = lock(&y_parts[c]);
                yc.copy_from_slice(&lock(&slots[c].2));
                for (_, _, pb) in slots.iter().skip(parts + c).step_by(parts) {
                    for (yv, pv) in yc.iter_mut().zip(lock(pb).iter()) {
                        *yv += pv;
                    }
                }
            }
        });
    } else {
        let width = chunk_width(n);
        let slots: Vec<Mutex<&mut [f32]>> = y.chunks_mut(width).map(Mutex::new).collect();
        par::for_each_block(slots.len(), |c| {
            kernel.cols(&args, xint_of(), c * width, &mut lock(&slots[c]));
        });
    }
}

/// `x` (padded rows of even length) pre-scaled for the AVX2 kernel, which
/// reads the nibbles in place as `q << 28` (even rows) and `q * 16` (odd
/// rows); empty for the kernels that do not read it (`MatvecArgs::xs`).
pub(super) fn prescaled(xp: &[f32], kernel: Matvec) -> Vec<f32> {
    if !kernel.uses_xs() {
        return Vec::new();
    }
    xp.iter()
        .enumerate()
        .map(|(i, v)| {
            if i % 2 == 0 {
                v * LO_SCALE
            } else {
                v * HI_SCALE
            }
        })
        .collect()
}

/// Largest partial-output buffer (in floats, 16 MiB) a thread keeps
/// between calls; a larger one is allocated for the call.
const SCRATCH_KEEP: usize = 1 << 22;

thread_local! {
    /// The calling thread's partial outputs of its last large matvec.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of floats whose contents are unspecified (every work item
/// overwrites its piece before reading it), kept per thread between calls:
/// allocating and zeroing it would delay every helper's start. Handed back
/// on drop.
struct Scratch {
    buf: Vec<f32>,
    len: usize,
}

impl Scratch {
    fn take(len: usize) -> Scratch {
        let mut buf = if len <= SCRATCH_KEEP {
            SCRATCH
                .try_with(|s| s.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        Scratch { buf, len }
    }

    fn get(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len <= SCRATCH_KEEP {
            let buf = std::mem::take(&mut self.buf);
            // (A nested call on this thread found the buffer taken and
            // used its own; whichever is handed back last is kept.)
            let _ = SCRATCH.try_with(|s| {
                if let Ok(mut v) = s.try_borrow_mut() {
                    *v = buf;
                }
            });
        }
    }
}

/// Lock a work item's slot (a panic in another item does not poison the
/// data for this one: each item writes only its own slot).
fn lock<'a, 'b, T: ?Sized>(m: &'a Mutex<&'b mut T>) -> MutexGuard<'a, &'b mut T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Input-row blocks a large matvec is split into (fixed, for determinism).
const K_BLOCKS: usize = 8;
/// Column pieces each input-row block is worked in.
const COL_PARTS: usize = 2;

/// Output columns per rayon task: about four tasks per thread, whole cache
/// lines, at most 4096 columns (16 KiB of `y` in L1).
pub(super) fn chunk_width(out_feat: usize) -> usize {
    let tasks = 4 * rayon::current_num_threads().max(1);
    let w = out_feat.div_ceil(tasks).next_multiple_of(128);
    w.clamp(128, 4096)
}
