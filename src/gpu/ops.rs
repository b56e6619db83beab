//! Kernel launches. Every function takes device addresses the caller has
//! checked (sizes, dtypes, device), queues its kernels on the legacy default
//! stream and returns when the result is complete, so the caller (and any
//! framework reading the result) sees finished data.

use std::ffi::c_void;

use cudarc::driver::result;

use super::caches::{self, LtState};
use super::context::{gpu_err, Gpu};
use super::memory::DeviceBuffer;
use super::nvrtc::{FP8, INT4, LINEAR};
use crate::error::{QuantError, Result};
use crate::fp8::Fp8Format;

/// Batch sizes up to this use the small-batch kernels (INT4 matvec, the
/// fused decode-dot); larger ones the tiled GEMMs.
pub const SMALL_BATCH_MAX: usize = 8;
/// Blocks the split-K INT4 matvec aims for (enough to fill a large GPU).
const MATVEC_TARGET_BLOCKS: usize = 2048;
const MV_COLS: usize = 256;
const GEMM_TILE: usize = 64;

fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        QuantError::arg(format!(
            "{what}: {v} is larger than the GPU kernels take (2^31 - 1)"
        ))
    })
}

/// Queue `f` on the legacy default stream. `params` are pointers to the
/// argument values.
pub(crate) fn launch(
    gpu: &Gpu,
    f: cudarc::driver::sys::CUfunction,
    grid: (usize, usize),
    block: u32,
    params: &mut [*mut c_void],
) -> Result<()> {
    if grid.0 == 0 || grid.1 == 0 {
        return Ok(());
    }
    if grid.0 > i32::MAX as usize || grid.1 > 65535 {
        return Err(QuantError::arg(format!(
            "the problem needs a launch grid of {grid:?} blocks, more than CUDA allows"
        )));
    }
    gpu.bind()?;
    // SAFETY: `f` is a kernel of a module loaded in this context and
    // `params` points at one value per kernel parameter, of the kernel's
    // types, all alive until the synchronisation below.
    unsafe {
        result::launch_kernel(
            f,
            (grid.0 as u32, grid.1 as u32, 1),
            (block, 1, 1),
            0,
            result::stream::null(),
            params,
        )
    }
    .map_err(|e| gpu_err("launching a kernel", e))
}

/// Whether an op waits for its kernels (every public call does; the
/// benchmark queues many calls between two events instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    Yes,
    /// Queue only. The caller must synchronise before reading the result
    /// or releasing any input.
    No,
}

fn finish(gpu: &Gpu, wait: Wait, r: Result<()>) -> Result<()> {
    r?;
    match wait {
        Wait::Yes => gpu.synchronize(),
        Wait::No => Ok(()),
    }
}

macro_rules! params {
    ($($v:ident),* $(,)?) => {
        [$( &mut $v as *mut _ as *mut c_void ),*]
    };
}

/// A packed INT4 weight on the device (see src/int4/mod.rs for the layout).
#[derive(Clone, Copy, Debug)]
pub struct Int4Args {
    pub data: u64,
    pub scales: u64,
    pub in_feat: usize,
    pub out_feat: usize,
    pub num_groups: usize,
    pub num_pairs: usize,
}

/// `y [batch, out] = x [batch, in] @ W (+ bias)`; `bias` 0 for none.
pub fn int4_matmul(
    gpu: &std::sync::Arc<Gpu>,
    w: &Int4Args,
    x: u64,
    batch: usize,
    bias: u64,
    y: u64,
    wait: Wait,
) -> Result<()> {
    if batch == 0 {
        return Ok(());
    }
    let (mut xp, mut dp, mut sp, mut bp, mut yp) = (x, w.data, w.scales, bias, y);
    let mut k = int("in_feat", w.in_feat)?;
    let mut n = int("out_feat", w.out_feat)?;
    let mut np = int("num_pairs", w.num_pairs)?;
    let mut ppg = int("pairs per group", w.num_pairs / w.num_groups)?;
    if batch <= SMALL_BATCH_MAX {
        let f = gpu.function(&INT4, "int4_matvec")?;
        let tiles = w.out_feat.div_ceil(MV_COLS);
        let want = MATVEC_TARGET_BLOCKS.div_ceil(tiles).clamp(1, w.num_groups);
        let gps = w.num_groups.div_ceil(want);
        let splits = w.num_groups.div_ceil(gps);
        let counter_bytes = (tiles * 4).next_multiple_of(256);
        let partial_bytes = if splits > 1 {
            splits * batch * w.out_feat * 4
        } else {
            0
        };
        let need = counter_bytes + partial_bytes;
        // Held for the launch: the counters and partial sums are per call.
        let caches = caches::of(gpu);
        let mut scratch = caches.counters.lock().unwrap_or_else(|p| p.into_inner());
        if scratch.as_ref().is_none_or(|b| b.bytes() < need) {
            *scratch = None; // free the old one first
            *scratch = Some(DeviceBuffer::zeros(gpu, need.max(1 << 20))?);
        }
        let buf = scratch.as_ref().expect("allocated above");
        let mut counters = buf.ptr();
        let mut partial = buf.ptr() + counter_bytes as u64;
        let mut b = int("batch", batch)?;
        let mut g = int("groups per split", gps)?;
        let r = launch(
            gpu,
            f,
            (tiles, splits),
            64,
            &mut params!(xp, dp, sp, bp, yp, partial, counters, b, k, n, np, ppg, g),
        );
        // Waits while holding the scratch (partials are per call); after a
        // failure the counters may not be zero any more: drop them.
        finish(gpu, wait, r).inspect_err(|_| *scratch = None)
    } else {
        let f = gpu.function(&INT4, "int4_gemm")?;
        let mut m = int("batch", batch)?;
        let r = launch(
            gpu,
            f,
            (w.out_feat.div_ceil(GEMM_TILE), batch.div_ceil(GEMM_TILE)),
            256,
            &mut params!(xp, dp, sp, bp, yp, m, k, n, np, ppg),
        );
        finish(gpu, wait, r)
    }
}

fn fmt_id(fmt: Fp8Format) -> i32 {
    match fmt {
        Fp8Format::E4M3 => 0,
        Fp8Format::E5M2 => 1,
    }
}

pub(crate) fn grid_1d(n: usize) -> usize {
    n.div_ceil(256).clamp(1, 65536)
}

/// `out[i] = encode(x[i])` for `n` f32 values into `n` codes.
pub fn fp8_encode(
    gpu: &Gpu,
    x: u64,
    out: u64,
    n: usize,
    fmt: Fp8Format,
    saturate: bool,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(&FP8, "fp8_encode_kernel")?;
    let (mut xp, mut op, mut nn) = (x, out, n as u64);
    let (mut fm, mut sat) = (fmt_id(fmt), saturate as i32);
    let r = launch(
        gpu,
        f,
        (grid_1d(n), 1),
        256,
        &mut params!(xp, op, nn, fm, sat),
    );
    finish(gpu, Wait::Yes, r)
}

/// `out[i] = decode(codes[i])` for `n` codes into `n` f32 values.
pub fn fp8_decode(gpu: &Gpu, codes: u64, out: u64, n: usize, fmt: Fp8Format) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(&FP8, "fp8_decode_kernel")?;
    let (mut cp, mut op, mut nn, mut fm) = (codes, out, n as u64, fmt_id(fmt));
    let r = launch(gpu, f, (grid_1d(n), 1), 256, &mut params!(cp, op, nn, fm));
    finish(gpu, Wait::Yes, r)
}

/// Storage of a `[N, K]` linear weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearKind {
    F32,
    I8,
    Fp8E4M3,
}

/// A linear layer's device data: `y = (x . w^T) * row_scale[o] * mult + bias`.
#[derive(Clone, Copy, Debug)]
pub struct LinearArgs {
    pub kind: LinearKind,
    pub weight: u64,
    /// Per-output scales (0: none).
    pub row_scale: u64,
    pub mult: f32,
    /// W8A8: activations go through `decode(encode(x / s_a))` first.
    pub act_scale: Option<f32>,
    /// 0: none.
    pub bias: u64,
    pub out_feat: usize,
    pub in_feat: usize,
}

/// `y [rows, out] = forward(x [rows, in])`.
pub fn linear_forward(
    gpu: &std::sync::Arc<Gpu>,
    l: &LinearArgs,
    x: u64,
    rows: usize,
    y: u64,
    wait: Wait,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let mut m = int("rows", rows)?;
    let mut n = int("out_features", l.out_feat)?;
    let mut k = int("in_features", l.in_feat)?;
    if let (LinearKind::Fp8E4M3, Some(a)) = (l.kind, l.act_scale) {
        if rows > SMALL_BATCH_MAX
            && gpu.compute_capability >= (8, 9)
            && super::cublaslt::shape_ok(rows, l.out_feat, l.in_feat)
            && fp8_gemm_cublaslt(gpu, l, a, x, rows, y)?
        {
            return finish(gpu, wait, Ok(()));
        }
    }
    // W8A8: the activations on the E4M3 grid, in a scratch buffer held
    // (with its lock) until the call has finished.
    let caches = caches::of(gpu);
    let mut scratch = caches.act_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let mut xp = match l.act_scale {
        None => x,
        Some(a) => {
            let count = rows * l.in_feat;
            quantize_activations(gpu, &mut scratch, "fp8_quantize_act", 4, x, count, a)?
        }
    };
    let (mut wp, mut rs, mut mult, mut bp, mut yp) = (l.weight, l.row_scale, l.mult, l.bias, y);
    let small = rows <= SMALL_BATCH_MAX;
    let name: &'static str = match (l.kind, small) {
        (LinearKind::F32, true) => "linear_f32_dot",
        (LinearKind::I8, true) => "linear_i8_dot",
        (LinearKind::Fp8E4M3, true) => "linear_fp8_dot",
        (LinearKind::F32, false) => "linear_f32_gemm",
        (LinearKind::I8, false) => "linear_i8_gemm",
        (LinearKind::Fp8E4M3, false) => "linear_fp8_gemm",
    };
    let f = gpu.function(&LINEAR, name)?;
    let (grid, block) = if small {
        ((l.out_feat.div_ceil(4), 1), 128)
    } else {
        (
            (l.out_feat.div_ceil(GEMM_TILE), rows.div_ceil(GEMM_TILE)),
            256,
        )
    };
    let r = launch(
        gpu,
        f,
        grid,
        block,
        &mut params!(xp, wp, rs, mult, bp, yp, m, n, k),
    );
    finish(gpu, wait, r)
}

/// The W8A8 forward on cuBLASLt (src/gpu/cublaslt.rs). `Ok(false)` when the
/// library cannot be used here (then the tiled kernel runs); the first
/// library failure is kept in the device's caches and reported by
/// `caches::fp8_gemm_path`.
fn fp8_gemm_cublaslt(
    gpu: &std::sync::Arc<Gpu>,
    l: &LinearArgs,
    act_scale: f32,
    x: u64,
    rows: usize,
    y: u64,
) -> Result<bool> {
    let caches = caches::of(gpu);
    let mut lt = caches.lt.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*lt, LtState::Untried) {
        *lt = match super::cublaslt::Lt::new(gpu) {
            Ok(h) => LtState::Ready(h),
            Err(e) => LtState::Failed(e.to_string()),
        };
    }
    let LtState::Ready(handle) = &*lt else {
        return Ok(false);
    };
    let count = rows * l.in_feat;
    let mut scratch = caches.act_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let codes = quantize_activations(gpu, &mut scratch, "fp8_encode_act", 1, x, count, act_scale)?;
    gpu.bind()?;
    let r = super::cublaslt::fp8_gemm(
        handle, l.weight, codes, y, l.mult, rows, l.out_feat, l.in_feat,
    );
    if let Err(e) = r {
        *lt = LtState::Failed(e.to_string());
        return Ok(false);
    }
    if l.bias != 0 {
        let f = gpu.function(&LINEAR, "add_bias")?;
        let (mut yp, mut bp, mut rr, mut nn) =
            (y, l.bias, rows as u64, int("out_features", l.out_feat)?);
        launch(
            gpu,
            f,
            (grid_1d(rows * l.out_feat), 1),
            256,
            &mut params!(yp, bp, rr, nn),
        )?;
    }
    Ok(true)
}

/// Queue the FP8 activation kernel `kernel` (`fp8_quantize_act`: f32 on the
/// E4M3 grid, 4 bytes an element; `fp8_encode_act`: E4M3 codes, 1 byte)
/// over the `count` elements at `x` with the activation scale, into the
/// device's scratch buffer (grown as needed); returns the buffer's address.
fn quantize_activations(
    gpu: &std::sync::Arc<Gpu>,
    scratch: &mut Option<DeviceBuffer>,
    kernel: &'static str,
    elem_bytes: usize,
    x: u64,
    count: usize,
    act_scale: f32,
) -> Result<u64> {
    let bytes = count * elem_bytes;
    if scratch.as_ref().is_none_or(|b| b.bytes() < bytes) {
        *scratch = None; // free the old one first
        *scratch = Some(DeviceBuffer::alloc(gpu, bytes.max(1 << 20))?);
    }
    let buf = scratch.as_ref().expect("allocated above").ptr();
    let f = gpu.function(&FP8, kernel)?;
    let (mut src, mut dst, mut nn, mut sa) = (x, buf, count as u64, act_scale);
    launch(
        gpu,
        f,
        (grid_1d(count), 1),
        256,
        &mut params!(src, dst, nn, sa),
    )?;
    Ok(buf)
}
