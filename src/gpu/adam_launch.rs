//! The optimizer kernels' launches on a device: [`Exec`] for the step's
//! sequence (`adam.rs`), the finiteness check and the accumulation helpers.
//! Every launch is queued on the legacy default stream.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result;

use super::adam::{self, AdamArgs, Exec};
use super::context::{gpu_err, Gpu};
use super::memory::{to_host, DeviceBuffer};
use super::nvrtc::OPTIM;
use super::ops::{grid_1d, launch};
use crate::error::{QuantError, Result};

/// The kernels on `gpu`, queued on the legacy default stream.
pub(crate) struct DeviceExec<'a>(pub(crate) &'a Arc<Gpu>);

impl Exec for DeviceExec<'_> {
    fn zero(&self, addr: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: `addr` holds `bytes` bytes of device memory we own.
        unsafe { result::memset_d8_sync(addr, 0, bytes) }
            .map_err(|e| gpu_err("zeroing device memory", e))
    }
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.0.bind()?;
        // SAFETY: two distinct device buffers of at least `bytes` bytes.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }
            .map_err(|e| gpu_err("copying on the device", e))
    }
    fn rank1_stats(&self, a: &AdamArgs) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_stats")?;
        let mut a = *a;
        let n = a.numel as usize;
        launch(
            self.0,
            f,
            (grid_1d(n), 1),
            256,
            &mut [&mut a as *mut _ as *mut c_void],
        )
    }
    fn rank1_clamp(&self, x: u64, n: usize, lo: f32, hi: f32) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_rank1_clamp")?;
        let (mut x, mut nn, mut lo, mut hi) = (x, n as u64, lo, hi);
        launch(
            self.0,
            f,
            (n.div_ceil(256), 1),
            256,
            &mut [
                &mut x as *mut _ as *mut c_void,
                &mut nn as *mut _ as *mut c_void,
                &mut lo as *mut _ as *mut c_void,
                &mut hi as *mut _ as *mut c_void,
            ],
        )
    }
    fn group_step(&self, a: &AdamArgs, groups: usize) -> Result<()> {
        let f = self.0.function(&OPTIM, "adam4bit_step")?;
        let mut a = *a;
        launch(
            self.0,
            f,
            (groups, 1),
            adam::GROUP_BLOCKS as u32,
            &mut [&mut a as *mut _ as *mut c_void],
        )
    }
}

/// The device-side elementwise helpers of the optimizer kernels.
fn all_finite(gpu: &Arc<Gpu>, x: u64, n: usize) -> Result<bool> {
    let flag = DeviceBuffer::zeros(gpu, 4)?;
    let f = gpu.function(&OPTIM, "all_finite_f32")?;
    let (mut xp, mut nn, mut fp) = (x, n as u64, flag.ptr());
    launch(
        gpu,
        f,
        (grid_1d(n), 1),
        256,
        &mut [
            &mut xp as *mut _ as *mut c_void,
            &mut nn as *mut _ as *mut c_void,
            &mut fp as *mut _ as *mut c_void,
        ],
    )?;
    Ok(to_host::<u32>(gpu, flag.ptr(), 1)?[0] == 0)
}

pub(crate) fn check_finite(gpu: &Arc<Gpu>, what: &str, x: u64, n: usize) -> Result<()> {
    if !all_finite(gpu, x, n)? {
        return Err(QuantError::arg(format!(
            "{what}: expected finite values, got a NaN or infinity"
        )));
    }
    Ok(())
}

/// `out = a + b` (`accum_add_f32` in place when `out == a`) or `out = s / d`.
pub(crate) fn elementwise(
    gpu: &Arc<Gpu>,
    kernel: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    d: f32,
) -> Result<()> {
    let f = gpu.function(&OPTIM, kernel)?;
    let (mut a, mut b, mut nn, mut dd) = (dst, src, n as u64, d);
    let mut params = vec![
        &mut a as *mut _ as *mut c_void,
        &mut b as *mut _ as *mut c_void,
    ];
    params.push(&mut nn as *mut _ as *mut c_void);
    if kernel == "accum_mean_f32" {
        // accum_mean_f32(const float* s, float* out, u64 n, float d)
        params.swap(0, 1);
        params.push(&mut dd as *mut _ as *mut c_void);
    }
    launch(gpu, f, (grid_1d(n), 1), 256, &mut params)
}
