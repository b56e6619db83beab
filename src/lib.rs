//! quantrs: low-bit training and inference kernels.
//!
//! The core modules know nothing of Python and build and test with
//! `cargo test` alone; `src/python/` (feature `python`) is the thin binding
//! layer that converts NumPy arrays, releases the GIL and maps errors.
//!
//! - [`int4`]: packed INT4 weights with per-group scales (`QuantizedWeight`).
//! - [`fp8`]: OCP FP8 E4M3 / E5M2 codecs.
//! - [`linear`]: the `QuantMethod` layers (`PerTensorFP8Linear` and the ISQ targets).
//! - [`optim`]: `Adam4bit` / `AdamW4bit` with packed 4-bit state.
//! - [`qat`]: `QatOptimizer`, quantization-aware training.

pub(crate) mod atomic;
pub mod error;
pub mod fp8;
pub mod gpu;
pub mod int4;
pub mod linear;
pub mod optim;
pub(crate) mod par;
pub mod qat;
pub(crate) mod range;
pub mod simd;
pub(crate) mod st;

#[cfg(feature = "python")]
mod python;
#[cfg(test)]
mod testutil;

pub use error::{QuantError, Result};
pub use int4::QuantizedWeight;

/// Crate version, as reported by `quantrs.build_info()`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Cargo features compiled into this build.
pub fn enabled_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "python") {
        f.push("python");
    }
    if cfg!(feature = "gpu") {
        f.push("gpu");
    }
    f
}
