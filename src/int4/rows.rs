//! `Y = X W` for a few rows of `X` (batch 2 to [`super::ROWS_MAX_BATCH`])
//! through a multi-row matvec kernel, which decodes each strip of packed
//! weights once for all the rows, so the weights are read from memory once
//! per call, not once per row. The work is cut into column pieces fixed by
//! the shape alone and run by [`crate::par::for_each_block`]; every output
//! is summed over the groups in order by one piece, so results do not
//! depend on the thread count.

use std::sync::{Mutex, MutexGuard};

use super::dispatch::Matvec;
use super::format::{MatvecArgs, RowsArgs};
use super::matvec::{chunk_width, prescaled, PAR_MIN_WEIGHTS};
use super::QuantizedWeightRef;
use crate::par;

/// `y [rows, out_feat] = x [rows, in_feat] @ W` with a kernel that has a
/// multi-row form ([`Matvec::has_rows`]).
pub(super) fn matmul_rows(
    qw: &QuantizedWeightRef,
    x: &[f32],
    rows: usize,
    y: &mut [f32],
    kernel: Matvec,
) {
    let in_padded = qw.in_padded();
    let n = qw.out_feat;
    let g = qw.num_groups;
    // The layout itself holds by construction (private fields, checked
    // constructors); the callers check the lengths of `x` and `y`.
    debug_assert!(x.len() == rows * qw.in_feat && y.len() == rows * n);
    let mut xp = vec![0.0f32; rows * in_padded];
    for (dst, src) in xp
        .chunks_exact_mut(in_padded)
        .zip(x.chunks_exact(qw.in_feat))
    {
        dst[..qw.in_feat].copy_from_slice(src);
    }
    // The row pitch is even, so a row's even elements are even in `xp`.
    let xs = prescaled(&xp, kernel);
    let args = RowsArgs {
        base: MatvecArgs {
            data: qw.data,
            scales: qw.scales,
            x: &xp,
            xs: &xs,
            out_feat: n,
            group_size: qw.group_size(),
            groups: 0..g,
        },
        rows,
        pitch: in_padded,
    };
    if in_padded * n < PAR_MIN_WEIGHTS {
        let mut ys: Vec<&mut [f32]> = y.chunks_exact_mut(n).collect();
        kernel.cols_rows(&args, 0, &mut ys);
        return;
    }
    // Column pieces: each holds its columns of every row of `y`.
    let width = chunk_width(n);
    let mut pieces: Vec<Vec<&mut [f32]>> = (0..n.div_ceil(width)).map(|_| Vec::new()).collect();
    for yr in y.chunks_exact_mut(n) {
        for (c, part) in yr.chunks_mut(width).enumerate() {
            pieces[c].push(part);
        }
    }
    let slots: Vec<Mutex<Vec<&mut [f32]>>> = pieces.into_iter().map(Mutex::new).collect();
    par::for_each_block(slots.len(), |c| {
        kernel.cols_rows(&args, c * width, &mut lock(&slots[c]));
    });
}

/// Lock a piece's slot (a panic in another piece does not poison the data
/// for this one: each piece writes only its own slot).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
