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
//! - `memory`: owned device buffers and host <-> device copies.
//! - `cublaslt`: the FP8 tensor-core GEMM of the W8A8 forward.
//! - `caches`: per-device scratch buffers and the cuBLASLt handle (above
//!   `context`, `memory` and `cublaslt`, which import one way).
//! - `ops`: the launches (INT4, FP8 codecs, linear layers), each ending
//!   when its result is ready.
//! - `layers`: `QuantizedWeight` and the linear layers held on a device.
//! - `adam`: the fused 4-bit Adam step's arguments and launch sequence;
//!   `adam_engine`: `AdamW4bit` / `Adam4bit` with their state on a device,
//!   over `adam_state` (one parameter's device state) and `adam_launch`
//!   (the optimizer kernels' launches).
//! - `qat`: the QAT step's arguments and sequence (`QatOptimizer` on a
//!   device); `qat_engine`: its state on a device, over `qat_launch` (the
//!   QAT kernels' launches); `qat_channels`: calibration of device arrays.

// The device objects are driven from the Python bindings only (no Rust API
// for them yet), so a `gpu` build without `python` leaves them unused.
#![cfg_attr(not(feature = "python"), allow(dead_code))]

use crate::error::{QuantError, Result};

#[cfg(feature = "gpu")]
pub(crate) mod adam;
#[cfg(feature = "gpu")]
pub(crate) mod adam_engine;
#[cfg(feature = "gpu")]
pub(crate) mod adam_launch;
#[cfg(feature = "gpu")]
pub(crate) mod adam_state;
#[cfg(feature = "gpu")]
pub(crate) mod caches;
#[cfg(feature = "gpu")]
pub(crate) mod context;
#[cfg(feature = "gpu")]
pub(crate) mod cublaslt;
#[cfg(all(test, feature = "gpu"))]
mod host_build;
#[cfg(all(test, feature = "gpu"))]
mod host_math;
#[cfg(feature = "gpu")]
pub(crate) mod layers;
#[cfg(feature = "gpu")]
pub(crate) mod memory;
#[cfg(feature = "gpu")]
pub mod nvrtc;
#[cfg(feature = "gpu")]
pub(crate) mod ops;
#[cfg(feature = "gpu")]
pub(crate) mod qat;
#[cfg(feature = "gpu")]
pub(crate) mod qat_channels;
#[cfg(feature = "gpu")]
pub(crate) mod qat_engine;
#[cfg(all(test, feature = "gpu"))]
mod qat_host;
#[cfg(feature = "gpu")]
pub(crate) mod qat_launch;

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
