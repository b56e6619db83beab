//! Kernel launches, queued on the legacy default stream (docs/gpu.md,
//! "Streams": nothing here waits for the kernels). The INT4 and linear
//! launches take device addresses and are `unsafe`: their typed, checked
//! callers are `layers.rs`; the FP8 codecs take typed views.

use std::ffi::c_void;

use cudarc::driver::result;

use super::caches::{self, LtState};
use super::context::{gpu_err, Gpu};
use super::memory::{check_view, DeviceBuffer, DeviceSlice, DeviceSliceMut};
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
///
/// # Safety
/// `f` is a kernel of a module loaded on `gpu`; `params` holds one pointer
/// per kernel parameter, to a value of that parameter's type, alive for the
/// call; every device address among the values is memory of `gpu` valid for
/// every access the kernel makes with this grid until the kernel has
/// finished (stream order: until later work on the legacy default stream).
pub(crate) unsafe fn launch(
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
    // SAFETY: the caller's contract (one value per parameter, of its type,
    // addresses valid for the kernel's accesses).
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

/// Queue `y [batch, out] = x [batch, in] @ W (+ bias)`; `bias` 0 for none.
///
/// # Safety
/// `w` describes a packed weight on `gpu` (`data`: `num_pairs * out_feat`
/// bytes, `scales`: `num_groups * out_feat` f32, `num_groups` dividing
/// `num_pairs`); `x` holds `batch * in_feat` f32, `y` room for
/// `batch * out_feat` f32 not overlapping the inputs, `bias` 0 or
/// `out_feat` f32; all on `gpu`, valid until the queued kernel has run.
pub(crate) unsafe fn int4_matmul(
    gpu: &std::sync::Arc<Gpu>,
    w: &Int4Args,
    x: u64,
    batch: usize,
    bias: u64,
    y: u64,
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
        // SAFETY: the caller's contract for the weight, x, bias and y; the
        // counters and partials are the device's scratch, sized above and
        // held (locked) for the launch; a later call's kernel runs after
        // this one (one stream), and a replaced scratch buffer waits for it
        // when dropped.
        let r = unsafe {
            launch(
                gpu,
                f,
                (tiles, splits),
                64,
                &mut params!(xp, dp, sp, bp, yp, partial, counters, b, k, n, np, ppg, g),
            )
        };
        // After a failed launch the counters may not be zero any more.
        r.inspect_err(|_| *scratch = None)
    } else {
        let f = gpu.function(&INT4, "int4_gemm")?;
        let mut m = int("batch", batch)?;
        // SAFETY: the caller's contract for the weight, x, bias and y.
        unsafe {
            launch(
                gpu,
                f,
                (w.out_feat.div_ceil(GEMM_TILE), batch.div_ceil(GEMM_TILE)),
                256,
                &mut params!(xp, dp, sp, bp, yp, m, k, n, np, ppg),
            )
        }
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

/// Queue `out[i] = encode(x[i])`: FP8 codes of f32 values (bit-identical
/// to `fp8::encode`), on the device of `x`.
pub fn fp8_encode(
    x: &DeviceSlice<'_, f32>,
    out: &mut DeviceSliceMut<'_, u8>,
    fmt: Fp8Format,
    saturate: bool,
) -> Result<()> {
    let gpu = x.gpu();
    check_view(gpu, "out", out.gpu(), out.len(), x.len())?;
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(&FP8, "fp8_encode_kernel")?;
    let (mut xp, mut op, mut nn) = (x.ptr(), out.ptr(), n as u64);
    let (mut fm, mut sat) = (fmt_id(fmt), saturate as i32);
    // SAFETY: `fp8_encode_kernel(const float*, u8*, u64, int, int)` reads
    // `n` f32 of `x` and writes `n` bytes of `out`, two views of that length
    // on this device (`out` borrowed mutably, so they do not overlap).
    unsafe {
        launch(
            gpu,
            f,
            (grid_1d(n), 1),
            256,
            &mut params!(xp, op, nn, fm, sat),
        )
    }
}

/// Queue `out[i] = decode(codes[i])`: f32 values of FP8 codes
/// (bit-identical to `fp8::decode`), on the device of `codes`.
pub fn fp8_decode(
    codes: &DeviceSlice<'_, u8>,
    out: &mut DeviceSliceMut<'_, f32>,
    fmt: Fp8Format,
) -> Result<()> {
    let gpu = codes.gpu();
    check_view(gpu, "out", out.gpu(), out.len(), codes.len())?;
    let n = codes.len();
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(&FP8, "fp8_decode_kernel")?;
    let (mut cp, mut op, mut nn, mut fm) = (codes.ptr(), out.ptr(), n as u64, fmt_id(fmt));
    // SAFETY: `fp8_decode_kernel(const u8*, float*, u64, int)` reads `n`
    // codes and writes `n` f32, two non-overlapping views of that length.
    unsafe { launch(gpu, f, (grid_1d(n), 1), 256, &mut params!(cp, op, nn, fm)) }
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

/// Queue `y [rows, out] = forward(x [rows, in])`.
///
/// # Safety
/// `l` describes a layer on `gpu` (`weight`: `out_feat * in_feat` elements
/// of its kind, `row_scale` 0 or `out_feat` f32, `bias` 0 or `out_feat`
/// f32); `x` holds `rows * in_feat` f32, `y` room for `rows * out_feat` f32
/// not overlapping the inputs; all valid until the queued kernels have run.
pub(crate) unsafe fn linear_forward(
    gpu: &std::sync::Arc<Gpu>,
    l: &LinearArgs,
    x: u64,
    rows: usize,
    y: u64,
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
            // SAFETY: the caller's contract.
            && unsafe { fp8_gemm_cublaslt(gpu, l, a, x, rows, y)? }
        {
            return Ok(());
        }
    }
    // W8A8: the activations on the E4M3 grid, in a scratch buffer held
    // (with its lock) while the kernels are queued.
    let caches = caches::of(gpu);
    let mut scratch = caches.act_scratch.lock().unwrap_or_else(|p| p.into_inner());
    let mut xp = match l.act_scale {
        None => x,
        Some(a) => {
            let count = rows * l.in_feat;
            // SAFETY: `x` holds `count` f32 (the caller's contract).
            unsafe { quantize_activations(gpu, &mut scratch, "fp8_quantize_act", 4, x, count, a)? }
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
    // SAFETY: `linear_*(const float* x, const void* w, const float* rs,
    // float mult, const float* b, float* y, int m, int n, int k)` over the
    // caller's buffers (or the activation scratch, held locked, of
    // `rows * in_feat` elements) with the grid covering `rows x out_feat`.
    unsafe {
        launch(
            gpu,
            f,
            grid,
            block,
            &mut params!(xp, wp, rs, mult, bp, yp, m, n, k),
        )
    }
}

/// The W8A8 forward on cuBLASLt (src/gpu/cublaslt.rs). `Ok(false)` when the
/// library cannot be used here (then the tiled kernel runs); the first
/// library failure is kept in the device's caches and reported by
/// `caches::fp8_gemm_path`.
///
/// # Safety
/// As [`linear_forward`] with an FP8 weight.
unsafe fn fp8_gemm_cublaslt(
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
    // SAFETY: `x` holds `count` f32 (the caller's contract).
    let codes =
        unsafe { quantize_activations(gpu, &mut scratch, "fp8_encode_act", 1, x, count, act_scale)? };
    gpu.bind()?;
    // SAFETY: the weight codes are `out_feat x in_feat`, the scratch holds
    // `rows x in_feat` codes (locked), `y` has room for `rows x out_feat`.
    let r = unsafe {
        super::cublaslt::fp8_gemm(
            handle, l.weight, codes, y, l.mult, rows, l.out_feat, l.in_feat,
        )
    };
    if let Err(e) = r {
        *lt = LtState::Failed(e.to_string());
        return Ok(false);
    }
    if l.bias != 0 {
        let f = gpu.function(&LINEAR, "add_bias")?;
        let (mut yp, mut bp, mut rr, mut nn) =
            (y, l.bias, rows as u64, int("out_features", l.out_feat)?);
        // SAFETY: `add_bias(float* y, const float* bias, u64 rows, int n)`
        // over `y` (`rows x out_feat`) and the bias (`out_feat`).
        unsafe {
            launch(
                gpu,
                f,
                (grid_1d(rows * l.out_feat), 1),
                256,
                &mut params!(yp, bp, rr, nn),
            )?;
        }
    }
    Ok(true)
}

/// Queue the FP8 activation kernel `kernel` (`fp8_quantize_act`: f32 on the
/// E4M3 grid, 4 bytes an element; `fp8_encode_act`: E4M3 codes, 1 byte)
/// over the `count` elements at `x` with the activation scale, into the
/// device's scratch buffer (grown as needed); returns the buffer's address.
///
/// # Safety
/// `x` holds `count` f32 on `gpu`, valid until the queued kernel has run.
unsafe fn quantize_activations(
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
    // SAFETY: `(const float* x, T* out, u64 n, float s)`: `x` per the
    // caller's contract, `out` the scratch of at least `count * elem_bytes`.
    unsafe {
        launch(
            gpu,
            f,
            (grid_1d(count), 1),
            256,
            &mut params!(src, dst, nn, sa),
        )?;
    }
    Ok(buf)
}
