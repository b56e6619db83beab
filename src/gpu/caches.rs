//! Per-device scratch buffers and library handles, kept for the process.
//!
//! They sit above `context` (the device), `memory` (the buffers they hold)
//! and `cublaslt` (the handle), so those three import one way: `context`
//! knows nothing of what is cached for a device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::context::Gpu;
use super::cublaslt::Lt;
use super::memory::DeviceBuffer;

/// Whether the cuBLASLt FP8 GEMM can be used on a device.
pub(crate) enum LtState {
    Untried,
    Ready(Lt),
    Failed(String),
}

/// What one device keeps between calls.
pub(crate) struct Caches {
    /// Zeroed per-column-tile counters of the split-K INT4 matvec (each
    /// call leaves them zero again).
    pub(crate) counters: Mutex<Option<DeviceBuffer>>,
    /// The W8A8 forward's quantized activations.
    pub(crate) act_scratch: Mutex<Option<DeviceBuffer>>,
    /// cuBLASLt for the FP8 GEMM: not tried yet, ready, or why not.
    pub(crate) lt: Mutex<LtState>,
}

/// The caches of `gpu`, made on first use.
pub(crate) fn of(gpu: &Gpu) -> Arc<Caches> {
    static ALL: OnceLock<Mutex<HashMap<usize, Arc<Caches>>>> = OnceLock::new();
    let mut map = ALL
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    map.entry(gpu.ordinal)
        .or_insert_with(|| {
            Arc::new(Caches {
                counters: Mutex::new(None),
                act_scratch: Mutex::new(None),
                lt: Mutex::new(LtState::Untried),
            })
        })
        .clone()
}

/// How the W8A8 forward at batch >= 16 runs on `gpu`: `"cublaslt"`,
/// `"tiled"` (pre-sm_89 or not tried yet) or `"tiled (<why>)"`.
pub fn fp8_gemm_path(gpu: &Gpu) -> String {
    if gpu.compute_capability < (8, 9) {
        return "tiled (needs sm_89+)".into();
    }
    match &*of(gpu).lt.lock().unwrap_or_else(|p| p.into_inner()) {
        LtState::Untried => "tiled (cuBLASLt not tried yet)".into(),
        LtState::Ready(_) => "cublaslt".into(),
        LtState::Failed(why) => format!("tiled ({why})"),
    }
}
