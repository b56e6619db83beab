//! GPU switch. The `gpu` cargo feature is reserved for cudarc-backed kernels;
//! in this build there are none, so every GPU entry point reports
//! [`QuantError::CudaNotAvailable`] and [`cuda_available`] is false.

use crate::error::{QuantError, Result};

/// Whether a CUDA device can be used by this build.
pub fn cuda_available() -> bool {
    false
}

/// The error every GPU entry point returns when no device can be used.
pub fn require_cuda() -> Result<()> {
    if cfg!(feature = "gpu") {
        Err(QuantError::CudaNotAvailable(
            "built with the `gpu` feature, but no CUDA kernels are compiled into this version"
                .into(),
        ))
    } else {
        Err(QuantError::CudaNotAvailable(
            "quantrs was built without the `gpu` feature".into(),
        ))
    }
}
