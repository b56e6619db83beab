//! The optimizer kernels' launches on a device: [`Exec`] for the step's
//! sequence (`adam.rs`), the finiteness check and the accumulation helpers.
//! Every launch is queued on the legacy default stream.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;

use super::adam::{self, AdamArgs, Exec};
use super::context::{gpu_err, Gpu};
use super::memory::{check_view, DeviceBuffer, DeviceSlice, DeviceSliceMut};
use super::nvrtc::OPTIM;
use super::ops::{grid_1d, launch};
use crate::error::{QuantError, Result};

/// The kernels on `gpu`, queued on the legacy default stream.
pub(crate) struct DeviceExec<'a>(pub(crate) &'a Arc<Gpu>);

/// The argument pointers of a kernel call.
macro_rules! params {
    ($($v:ident),* $(,)?) => {
        [$( &mut $v as *mut _ as *mut c_void ),*]
    };
}

impl Exec for DeviceExec<'_> {
    unsafe fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: `addr` holds `bytes` bytes of device memory (the trait's
        // contract); queued on the legacy default stream.
        unsafe { result::memset_d8_async(addr, 0, bytes, result::stream::null()) }
            .map_err(|e| gpu_err("zeroing device memory", e))
    }
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: two distinct device buffers of at least `bytes` bytes
        // (the trait's contract).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, result::stream::null()) }
            .map_err(|e| gpu_err("copying on the device", e))
    }
    unsafe fn rank1_stats(&self, a: &AdamArgs) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_stats")?;
        let mut a = *a;
        let n = a.numel as usize;
        // SAFETY: `adam4bit_rank1_stats(AdamArgs)` over the addresses of
        // `a` (the trait's contract).
        unsafe { launch(self.0, f, (grid_1d(n), 1), 256, &mut params!(a)) }
    }
    unsafe fn rank1_clamp(&self, x: u64, n: usize, lo: f32, hi: f32) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_clamp")?;
        let (mut x, mut nn, mut lo, mut hi) = (x, n as u64, lo, hi);
        // SAFETY: `adam4bit_rank1_clamp(float*, u64, float, float)` over
        // `n` f32 at `x` (the trait's contract).
        unsafe {
            launch(
                self.0,
                f,
                (n.div_ceil(256), 1),
                256,
                &mut params!(x, nn, lo, hi),
            )
        }
    }
    unsafe fn group_step(&self, a: &AdamArgs, groups: usize) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_step")?;
        let mut a = *a;
        // SAFETY: `adam4bit_step(AdamArgs)`, one block per group (the
        // trait's contract).
        unsafe {
            launch(
                self.0,
                f,
                (groups, 1),
                adam::GROUP_BLOCKS as u32,
                &mut params!(a),
            )
        }
    }
}

/// Whether every value of `x` is finite (reads one flag back, so it waits
/// for the queued work that writes `x`).
fn all_finite(x: &DeviceSlice<'_, f32>) -> Result<bool> {
    let gpu = x.gpu();
    let flag = DeviceBuffer::zeros(gpu, 4)?;
    let f = gpu.function(&OPTIM, "all_finite_f32")?;
    let (mut xp, mut nn, mut fp) = (x.ptr(), x.len() as u64, flag.ptr());
    // SAFETY: `all_finite_f32(const float*, u64, u32*)` reads the view's
    // `len` f32 and writes the 4-byte flag.
    unsafe {
        launch(
            gpu,
            f,
            (grid_1d(x.len()), 1),
            256,
            &mut params!(xp, nn, fp),
        )?;
    }
    Ok(flag.to_host::<u32>()?[0] == 0)
}

/// An `InvalidArgument` naming `what` when `x` holds a NaN or an infinity.
pub(crate) fn check_finite(what: &str, x: &DeviceSlice<'_, f32>) -> Result<()> {
    if !all_finite(x)? {
        return Err(QuantError::arg(format!(
            "{what}: expected finite values, got a NaN or infinity"
        )));
    }
    Ok(())
}

/// Queue `sum += g` elementwise (`accum_add_f32`).
pub(crate) fn accum_add(sum: &mut DeviceSliceMut<'_, f32>, g: &DeviceSlice<'_, f32>) -> Result<()> {
    let gpu = sum.gpu();
    check_view(gpu, "grad", g.gpu(), g.len(), sum.len())?;
    let f = gpu.function(&OPTIM, "accum_add_f32")?;
    let n = sum.len();
    let (mut a, mut b, mut nn) = (sum.ptr(), g.ptr(), n as u64);
    // SAFETY: `accum_add_f32(float* a, const float* b, u64 n)` over two
    // views of `n` f32 on this device (`sum` borrowed mutably: no overlap).
    unsafe { launch(gpu, f, (grid_1d(n), 1), 256, &mut params!(a, b, nn)) }
}

/// Queue `out = sum / d` elementwise (`accum_mean_f32`, one f32 division).
pub(crate) fn accum_mean(
    sum: &DeviceSlice<'_, f32>,
    out: &mut DeviceSliceMut<'_, f32>,
    d: f32,
) -> Result<()> {
    let gpu = sum.gpu();
    check_view(gpu, "out", out.gpu(), out.len(), sum.len())?;
    let f = gpu.function(&OPTIM, "accum_mean_f32")?;
    let n = sum.len();
    let (mut s, mut o, mut nn, mut dd) = (sum.ptr(), out.ptr(), n as u64, d);
    // SAFETY: `accum_mean_f32(const float* s, float* out, u64 n, float d)`
    // over two views of `n` f32 on this device (`out` borrowed mutably).
    unsafe { launch(gpu, f, (grid_1d(n), 1), 256, &mut params!(s, o, nn, dd)) }
}
