//! The QAT kernels' launches on a device: [`QatExec`] for the step's
//! sequence (`qat.rs`). Every launch is queued on the legacy default
//! stream; the dry pass's triples are read back (which waits for it) and
//! the commit pass is waited for, so a step is complete when it returns.

use std::ffi::c_void;
use std::sync::Arc;

use super::context::Gpu;
use super::memory::to_host;
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
    fn run(&self, name: &'static str, a: &QatArgs, blocks: usize) -> Result<()> {
        let f = self.0.function(&QAT, name)?;
        let mut a = *a;
        launch(
            self.0,
            f,
            (blocks, 1),
            THREADS as u32,
            &mut [&mut a as *mut _ as *mut c_void],
        )
    }
}

impl QatExec for QatDevice<'_> {
    fn dry<T: DevMaster>(&self, a: &QatArgs) -> Result<(f64, f64, bool)> {
        let blocks = dry_blocks(a.n as usize);
        self.run(kernel::<T>("dry"), a, blocks)?;
        let p = to_host::<f64>(self.0, a.partials, 3 * blocks)?;
        Ok(reduce_partials(&p))
    }
    fn commit<T: DevMaster>(&self, a: &QatArgs) -> Result<()> {
        let blocks = (a.n as usize).div_ceil(THREADS).clamp(1, 65536);
        self.run(kernel::<T>("commit"), a, blocks)?;
        self.0.synchronize()
    }
    fn read<T: DevMaster>(&self, addr: u64, n: usize) -> Result<Vec<T>> {
        to_host::<T>(self.0, addr, n)
    }
}
