//! `activations = "int8"`: `Y = X W` with `x` quantized to int8 per group
//! ([`xq8`]) and integer dot products against the packed nibbles
//! (docs/int4.md, "Int8 activations"). Opt-in: it trades the float32 path's
//! 1e-5 relative bound for the activation rounding error, stated as
//! `|y_o - (x @ W)_o| <= sum_g d[g] / 2 * sum_{i in g} |w_io|` plus f32
//! rounding, and runs on fewer instructions per weight.
//!
//! The work is cut into pieces fixed by the shape alone (blocks of rows of
//! `x` times column chunks), each summing its outputs over every group in
//! order, so results do not depend on the thread count; the scalar twin,
//! the AVX2 per-row kernel and the blocked GEMM ([`gemm`], from
//! 5 rows, in pieces of 64 rows) give the same bits.
//!
//! The files import one way: this driver -> `xq8` (quantizing `x`) and
//! the kernels: `avx2` (per row) and `gemm` (decoded panels) -> `micro`
//! (the GEMM's micro-kernels and their tokens) -> `scalar` (the argument
//! struct and the scalar twin every kernel matches) -> `xq8`.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod gemm;
#[cfg(target_arch = "x86_64")]
mod micro;
mod scalar;
mod xq8;

#[cfg(all(test, target_arch = "x86_64"))]
mod amx_tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod gemm_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use super::matvec::{chunk_width, PAR_MIN_WEIGHTS};
use super::{QuantizedWeight, QuantizedWeightRef};
use crate::error::{QuantError, Result};
#[cfg(target_arch = "x86_64")]
use crate::linear::tiles::AmxInt8;
use crate::par;
use crate::simd::{self, SimdLevel};
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
#[cfg(target_arch = "x86_64")]
use micro::Micro;
use scalar::{cols_scalar, A8Args};
use xq8::Xq8;

/// Rows of `x` one piece of a batched call serves (a pass of the AVX2
/// kernel takes 4; 16 keep a piece's outputs in L2).
const ROW_BLOCK: usize = 16;
/// Largest batch split along the groups (`run_split`); its partial
/// outputs grow with the batch while the weights' share of the time falls.
const SPLIT_MAX_BATCH: usize = 4;
/// Group blocks of a split call (fixed, for determinism).
pub(super) const K_BLOCKS: usize = 8;
/// Column parts of a split call: one, so that a piece's packed bytes are
/// one contiguous stretch (its groups' rows, every column).
const COL_PARTS: usize = 1;

/// How `matvec` / `matmul` treat the activations `x`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// `x` as given, float32 arithmetic (the default, within 1e-5).
    #[default]
    Float32,
    /// `x` quantized to int8 per group, integer dot products.
    Int8,
}

impl Activations {
    /// Parse `"float32"` or `"int8"`; anything else is an error naming the
    /// argument and the expected values.
    pub fn parse(s: &str) -> Result<Activations> {
        match s {
            "float32" => Ok(Activations::Float32),
            "int8" => Ok(Activations::Int8),
            _ => Err(QuantError::arg(format!(
                "activations: expected 'float32' or 'int8', got {s:?}"
            ))),
        }
    }
}

/// An int8-activation kernel with the token that lets it run.
#[derive(Clone, Copy, Debug)]
enum A8 {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    /// The blocked GEMM ([`gemm`]), for large batches.
    #[cfg(target_arch = "x86_64")]
    Gemm(Micro),
    /// The GEMM on the AMX tile unit ([`amx`]), for prefill-sized batches.
    #[cfg(target_arch = "x86_64")]
    Amx(AmxInt8),
}

impl A8 {
    /// The kernel for a call of `batch` rows: the blocked GEMM from
    /// `gemm::MIN_BATCH` rows where it may run, else
    /// [`Self::for_weights`].
    fn for_call(level: SimdLevel, group_size: usize, batch: usize) -> A8 {
        #[cfg(target_arch = "x86_64")]
        if batch >= amx::MIN_BATCH && amx::chosen(group_size) && Avx512::at(level).is_some() {
            if let Some(t) = AmxInt8::new() {
                return A8::Amx(t);
            }
        }
        #[cfg(target_arch = "x86_64")]
        if batch >= gemm::MIN_BATCH {
            if let Some(m) = Micro::at(level, group_size) {
                return A8::Gemm(m);
            }
        }
        let _ = batch;
        A8::for_weights(level, group_size)
    }

    /// Rows of `x` per piece of a parallel call.
    fn row_block(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            A8::Gemm(_) => gemm::ROW_BLOCK,
            #[cfg(target_arch = "x86_64")]
            A8::Amx(_) => amx::ROW_BLOCK,
            _ => ROW_BLOCK,
        }
    }

    /// The (columns, rows) of each piece of a parallel call of `batch`
    /// rows times `n` columns: the AVX2 GEMM's shape-only task grid
    /// (`gemm::task_grid`), column chunks by [`chunk_width`] and blocks of
    /// [`Self::row_block`] rows otherwise.
    fn pieces(self, n: usize, batch: usize) -> (usize, usize) {
        #[cfg(target_arch = "x86_64")]
        if let A8::Gemm(Micro::Avx2(_)) = self {
            let g = gemm::task_grid(n, batch);
            return (g.cols, g.rows);
        }
        let _ = batch;
        (chunk_width(n), self.row_block())
    }

    /// The best per-row kernel allowed at `level` for weights of `group_size`.
    fn for_weights(level: SimdLevel, group_size: usize) -> A8 {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = Avx2::at(level) {
            if avx2::eligible(group_size) {
                return A8::Avx2(t);
            }
        }
        let _ = (level, group_size);
        A8::Scalar
    }

    fn cols(self, args: &A8Args, rows: Range<usize>, o0: usize, ys: &mut [&mut [f32]]) {
        match self {
            A8::Scalar => cols_scalar(args, rows, o0, ys),
            // SAFETY: the token proves AVX2; the kernel checks every size.
            #[cfg(target_arch = "x86_64")]
            A8::Avx2(t) => unsafe { avx2::cols(t, args, rows, o0, ys) },
            #[cfg(target_arch = "x86_64")]
            A8::Gemm(m) => gemm::cols(m, args, rows, o0, ys),
            #[cfg(target_arch = "x86_64")]
            A8::Amx(t) => amx::cols(t, args, rows, o0, ys),
        }
    }
}

impl QuantizedWeight {
    #[cfg(test)]
    fn a8_args<'a>(&'a self, xq: &'a Xq8) -> A8Args<'a> {
        self.view().a8_args(xq)
    }
}

impl QuantizedWeightRef<'_> {
    /// `try_matmul` with the activations treated as `act` says.
    pub fn matmul_act(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        act: Activations,
    ) -> Result<()> {
        match act {
            Activations::Float32 => self.try_matmul(x, batch, y),
            Activations::Int8 => self.matmul_a8_with(x, batch, y, simd::level()),
        }
    }

    /// `Y = X W` with int8 activations (see the module docs) at an explicit
    /// SIMD level (for tests and benches); a level above the one in force
    /// is an error. A non-finite `x` is an error.
    pub fn matmul_a8_with(
        &self,
        x: &[f32],
        batch: usize,
        y: &mut [f32],
        level: SimdLevel,
    ) -> Result<()> {
        let nx = batch.checked_mul(self.in_feat);
        let ny = batch.checked_mul(self.out_feat);
        if nx != Some(x.len()) || ny != Some(y.len()) {
            return Err(QuantError::dims(
                "x/y",
                format!("[{batch}, {}] / [{batch}, {}]", self.in_feat, self.out_feat),
                format!("{} / {} elements", x.len(), y.len()),
            ));
        }
        simd::require(level)?;
        if batch == 0 {
            return Ok(());
        }
        let gs = self.group_size();
        #[cfg(target_arch = "x86_64")]
        let fast = Avx2::at(level);
        #[cfg(not(target_arch = "x86_64"))]
        let fast = None;
        let xq = Xq8::quantize(x, batch, self.in_feat, self.in_padded(), gs, fast)?;
        let args = self.a8_args(&xq);
        args.check();
        run(&args, batch, y, A8::for_call(level, gs, batch));
        Ok(())
    }
}

impl<'w> QuantizedWeightRef<'w> {
    /// The kernels' arguments for these weights times every group of `xq`
    /// (quantized for this weight's group size).
    fn a8_args<'a>(&self, xq: &'a Xq8) -> A8Args<'a>
    where
        'w: 'a,
    {
        A8Args {
            data: self.data,
            scales: self.scales,
            out_feat: self.out_feat,
            group_size: self.group_size(),
            x: xq,
            groups: 0..xq.num_groups,
        }
    }
}

/// Every row of `y` `[batch, out_feat]` from checked arguments.
fn run(args: &A8Args, batch: usize, y: &mut [f32], kernel: A8) {
    let n = args.out_feat;
    if batch * args.x.pitch * n < PAR_MIN_WEIGHTS {
        let mut ys: Vec<&mut [f32]> = y.chunks_exact_mut(n).collect();
        kernel.cols(args, 0..batch, 0, &mut ys);
    } else if batch <= SPLIT_MAX_BATCH && args.x.num_groups >= K_BLOCKS {
        run_split(args, batch, y, kernel);
    } else {
        run_columns(args, batch, y, kernel);
    }
}

/// Pieces of a block of rows of `x` times a column chunk, each holding its
/// columns of its rows of `y` and summing them over every group.
fn run_columns(args: &A8Args, batch: usize, y: &mut [f32], kernel: A8) {
    let n = args.out_feat;
    let (width, rblock) = kernel.pieces(n, batch);
    let chunks = n.div_ceil(width);
    let mut pieces: Vec<Vec<&mut [f32]>> = (0..batch.div_ceil(rblock) * chunks)
        .map(|_| Vec::new())
        .collect();
    for (r, yr) in y.chunks_exact_mut(n).enumerate() {
        for (c, part) in yr.chunks_mut(width).enumerate() {
            pieces[r / rblock * chunks + c].push(part);
        }
    }
    let slots: Vec<Mutex<Vec<&mut [f32]>>> = pieces.into_iter().map(Mutex::new).collect();
    par::for_each_block(slots.len(), |t| {
        let (rb, c) = (t / chunks, t % chunks);
        let rows = rb * rblock..((rb + 1) * rblock).min(batch);
        kernel.cols(args, rows, c * width, &mut lock(&slots[t]));
    });
}

/// Few rows: pieces of a block of groups and every column, so that each
/// piece streams one contiguous stretch of the packed bytes (what DRAM
/// and the prefetchers like best), into partial outputs added in block
/// order afterwards. The split depends on the shape alone.
fn run_split(args: &A8Args, batch: usize, y: &mut [f32], kernel: A8) {
    let (n, g) = (args.out_feat, args.x.num_groups);
    let per_block = g.div_ceil(K_BLOCKS);
    let blocks = g.div_ceil(per_block);
    // Whole strips of the AVX2 kernel in every part but the last.
    let width = n.div_ceil(COL_PARTS).next_multiple_of(64);
    let parts = n.div_ceil(width);
    // Kept per thread between calls: a fresh buffer of this size is mapped
    // and faulted in on every call. Its contents do not matter (the kernels
    // write every output before reading it).
    let mut partial = PARTIAL.with(|p| std::mem::take(&mut *p.borrow_mut()));
    partial.resize(blocks * batch * n, 0.0);
    let mut pieces: Vec<Vec<&mut [f32]>> = (0..blocks * parts).map(|_| Vec::new()).collect();
    for (i, yr) in partial.chunks_exact_mut(n).enumerate() {
        let b = i / batch;
        for (c, part) in yr.chunks_mut(width).enumerate() {
            pieces[b * parts + c].push(part);
        }
    }
    let slots: Vec<Mutex<Vec<&mut [f32]>>> = pieces.into_iter().map(Mutex::new).collect();
    par::for_each_block(slots.len(), |t| {
        let (b, c) = (t / parts, t % parts);
        let block = A8Args {
            groups: b * per_block..((b + 1) * per_block).min(g),
            ..*args
        };
        kernel.cols(&block, 0..batch, c * width, &mut lock(&slots[t]));
    });
    drop(slots);
    let (first, rest) = partial.split_at(batch * n);
    y.copy_from_slice(first);
    for p in rest.chunks_exact(batch * n) {
        for (yv, pv) in y.iter_mut().zip(p) {
            *yv += pv;
        }
    }
    if partial.len() <= PARTIAL_KEEP {
        PARTIAL.with(|p| *p.borrow_mut() = partial);
    }
}

/// Largest partial-sum buffer (floats, 4 MiB) a thread keeps between calls.
const PARTIAL_KEEP: usize = 1 << 20;

thread_local! {
    /// The calling thread's partial sums of its last split call.
    static PARTIAL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Lock a piece's slot (a panic in another piece does not poison the data
/// for this one: each piece writes only its own slot).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
