//! GPU support (docs/gpu.md). With the `gpu` cargo feature the kernels in
//! `kernels/*.cu` run on NVIDIA devices through cudarc: the driver and
//! NVRTC are loaded at run time, so one build serves machines with and
//! without a GPU. Without the feature, or without a usable device, every
//! GPU entry point reports [`QuantError::CudaNotAvailable`] and
//! [`cuda_available`] is false.
//!
//! - `context`: one context per device, its compute capability, the
//!   compiled-module cache.
//! - `nvrtc`: the kernel sources and their compilation (CUBIN for the
//!   device's architecture, PTX for the CI check).
//! - `memory`: owned device buffers, the typed views kernels take, and
//!   host <-> device copies.
//! - `cublaslt`: the FP8 tensor-core GEMM of the W8A8 forward.
//! - `caches`: per-device scratch buffers and the cuBLASLt handle (above
//!   `context`, `memory` and `cublaslt`, which import one way).
//! - `ops`: the launches (INT4, FP8 codecs, linear layers), queued on the
//!   legacy default stream.
//! - `layers`: `QuantizedWeight` and the linear layers held on a device.
//! - `adam`: the fused 4-bit Adam step's arguments and launch sequence;
//!   `adam_engine`: `AdamW4bit` / `Adam4bit` with their state on a device,
//!   over `adam_state` (one parameter's device state) and `adam_launch`
//!   (the optimizer kernels' launches).
//! - `qat`: the QAT step's arguments and sequence (`QatOptimizer` on a
//!   device); `qat_engine`: its state on a device, over `qat_launch` (the
//!   QAT kernels' launches); `qat_channels`: calibration of device arrays.
//!
//! The Rust API (docs/rust.md, "GPU"): `device` opens a `Gpu`;
//! `DeviceBuffer` owns device memory and hands out the typed views
//! `DeviceSlice` / `DeviceSliceMut` every kernel takes; the device
//! objects are `DeviceQuantizedWeight`, `DeviceLinear`, `DeviceAdam`
//! (AdamW4bit / Adam4bit) and `DeviceQat` (`QatOptimizer`), each built
//! from its CPU twin and turned back into it. Kernels are queued on the
//! legacy default stream; a copy to the host waits for them.

use crate::error::{QuantError, Result};

/// Declares each item only in builds with the `gpu` feature.
macro_rules! with_gpu {
    ($($item:item)*) => { $( #[cfg(feature = "gpu")] $item )* };
}

with_gpu! {
    pub(crate) mod adam;
    pub(crate) mod adam_engine;
    pub(crate) mod adam_launch;
    pub(crate) mod adam_state;
    pub(crate) mod caches;
    pub(crate) mod context;
    pub(crate) mod cublaslt;
    pub(crate) mod layers;
    pub(crate) mod memory;
    pub mod nvrtc;
    pub(crate) mod ops;
    pub(crate) mod qat;
    pub(crate) mod qat_channels;
    pub(crate) mod qat_engine;
    pub(crate) mod qat_launch;

    pub use adam_engine::{DeviceAdam, DeviceParam};
    pub use caches::fp8_gemm_path;
    pub use context::{device, device_count, Gpu, MIN_COMPUTE_CAPABILITY};
    pub use layers::{DeviceLinear, DeviceQuantizedWeight, DeviceWeight};
    pub use memory::{DeviceBuffer, DeviceElem, DeviceSlice, DeviceSliceMut};
    pub use ops::{fp8_decode, fp8_encode};
    pub use qat::{DevMaster, QatScalars};
    pub use qat_channels::{calibrate, calibrate_per_channel};
    pub use qat_engine::DeviceQat;
}

#[cfg(all(test, feature = "gpu"))]
mod host_build;
#[cfg(all(test, feature = "gpu"))]
mod host_math;
#[cfg(all(test, feature = "gpu"))]
mod qat_host;

/// Whether a CUDA device can be used by this build: decided at run time
/// (libcuda loads, device 0 exists, its compute capability is supported).
pub fn cuda_available() -> bool {
    #[cfg(feature = "gpu")]
    {
        context::device(0).is_ok()
    }
    #[cfg(not(feature = "gpu"))]
    {
        false
    }
}

/// `Ok` when device 0 can be used, else the reason as `CudaNotAvailable`.
pub fn require_cuda() -> Result<()> {
    #[cfg(feature = "gpu")]
    {
        context::device(0).map(|_| ())
    }
    #[cfg(not(feature = "gpu"))]
    {
        Err(QuantError::CudaNotAvailable(
            "quantrs was built without the `gpu` feature".into(),
        ))
    }
}

/// Why this build has no GPU, or `None` when device 0 is usable.
pub fn unavailable_reason() -> Option<String> {
    match require_cuda() {
        Ok(()) => None,
        Err(QuantError::CudaNotAvailable(m)) | Err(QuantError::Gpu(m)) => Some(m),
        Err(e) => Some(e.to_string()),
    }
}
