//! The QAT kernels' launches on a device: [`QatExec`] for the step's
//! sequence (`qat.rs`). Every launch is queued on the legacy default
//! stream; the dry pass's triples are read back (which waits for it), the
//! commit pass is queued.

use std::ffi::c_void;
use std::sync::Arc;

use super::context::Gpu;
use super::memory::DeviceSlice;
use super::nvrtc::QAT;
use super::ops::launch;
use super::qat::{dry_blocks, reduce_partials, DevMaster, QatArgs, QatExec, THREADS};
use crate::error::Result;

/// The QAT kernels on a device.
pub(crate) struct QatDevice<'a>(pub(crate) &'a Arc<Gpu>);

fn kernel<T: DevMaster>(pass: &str) -> &'static str {
    match (pass, T::SUFFIX) {
        ("dry", "f32") => "qat_dry_f32",
        ("dry", _) => "qat_dry_f64",
        (_, "f32") => "qat_commit_f32",
        _ => "qat_commit_f64",
    }
}

impl QatDevice<'_> {
    /// # Safety
    /// `a` satisfies [`QatExec`]'s contract for the kernel `name`.
    unsafe fn run(&self, name: &'static str, a: &QatArgs, blocks: usize) -> Result<()> {
        let f = self.0.function(&QAT, name)?;
        let mut a = *a;
        // SAFETY: `qat_*(QatArgs)` over the buffers of `a` (the contract).
        unsafe {
            launch(
                self.0,
                f,
                (blocks, 1),
                THREADS as u32,
                &mut [&mut a as *mut _ as *mut c_void],
            )
        }
    }
}

impl QatExec for QatDevice<'_> {
    unsafe fn dry<T: DevMaster>(&self, a: &QatArgs) -> Result<(f64, f64, bool)> {
        let blocks = dry_blocks(a.n as usize);
        // SAFETY: the trait's contract; `partials` holds 3 * blocks f64.
        let p = unsafe {
            self.run(kernel::<T>("dry"), a, blocks)?;
            DeviceSlice::<f64>::from_raw(self.0, a.partials, 3 * blocks).to_host()?
        };
        Ok(reduce_partials(&p))
    }
    unsafe fn commit<T: DevMaster>(&self, a: &QatArgs) -> Result<()> {
        let blocks = (a.n as usize).div_ceil(THREADS).clamp(1, 65536);
        // SAFETY: the trait's contract.
        unsafe { self.run(kernel::<T>("commit"), a, blocks) }
    }
    unsafe fn read<T: DevMaster>(&self, addr: u64, n: usize) -> Result<Vec<T>> {
        // SAFETY: `addr` holds `n` elements of T on this device (the contract).
        unsafe { DeviceSlice::<T>::from_raw(self.0, addr, n) }.to_host()
    }
}
