//! quantrs: low-bit training and inference on CPUs, with a Python binding.
//!
//! Four public types on [`ndarray`] arrays (the slice kernels stay inside;
//! docs/rust.md compares them with the original crates' API):
//!
//! - [`QatOptimizer`]: quantization-aware training. AdamW on caller-owned
//!   full-precision master weights (`Array1<f64>` or `Array1<f32>`) with a
//!   fake-quantized view (int8 / int4 / FP8) re-derived after every step;
//!   stochastic rounding draws one key per step from a [`rand::Rng`].
//! - [`AdamW4bit`] / [`Adam4bit`]: AdamW whose moments live in packed 4-bit
//!   form, through the [`Optimizer`] and [`StatefulOptimizer`] traits on
//!   `ArrayViewMutD<f32>` parameters of any shape.
//! - [`PerTensorFP8Linear`]: an FP8 E4M3 linear layer behind the
//!   [`QuantMethod`] / [`QuantizedSerde`] traits (`ArrayViewD` in, `ArrayD`
//!   out), loadable from a per-tensor FP8 safetensors checkpoint.
//! - [`QuantizedWeight`]: packed INT4 weights with per-group scales and
//!   matvec / GEMM, on slices or `ArrayView2`.
//!
//! Every fallible call returns [`Result`] with one error type,
//! [`QuantError`] (also reachable as [`GpuOptimError`]); on error
//! nothing changes. Kernels pick AVX2 / AVX-512 at run time and run on all
//! cores with rayon; results do not depend on the thread count.
//!
//! ```
//! use ndarray::Array2;
//! use quantrs::{AdamW4bit, Optimizer, QuantizedWeight};
//!
//! // Train a weight with 4-bit AdamW state, then serve it as packed INT4.
//! let mut w = Array2::<f32>::from_shape_fn((64, 16), |(i, o)| ((i + o) as f32).sin());
//! let mut opt = AdamW4bit::new(1e-2, 0.9, 0.999, 1e-8, 0.0);
//! for _ in 0..3 {
//!     let grad = w.mapv(|v| 2.0 * v); // d/dw of |w|^2
//!     opt.update(w.view_mut().into_dyn(), grad.view().into_dyn())?;
//!     opt.step();
//! }
//! let qw = QuantizedWeight::quantize_array(w.view(), 32)?;
//! let y = qw.matvec_array(Array2::<f32>::ones((1, 64)).row(0))?;
//! assert_eq!(y.len(), 16);
//! # Ok::<(), quantrs::QuantError>(())
//! ```
//!
//! Modules: [`int4`] (`QuantizedWeight`), [`fp8`] (OCP FP8 E4M3 / E5M2
//! codecs), [`linear`] (the `QuantMethod` layers), [`optim`] (the 4-bit
//! optimizers), [`qat`] (`QatOptimizer`), [`simd`] (the CPU proof tokens),
//! [`gpu`] (the GPU switch). The core knows nothing of Python and builds
//! and tests with `cargo test` alone; `src/python/` (feature `python`) is
//! the binding layer. docs/rust.md describes the Rust API in full.

#![deny(missing_docs)]

pub(crate) mod atomic;
pub mod error;
pub mod format;
pub mod fp8;
pub mod ggml;
pub mod gpu;
pub(crate) mod hugepages;
pub mod int4;
pub mod int4_asym;
pub mod int4_k;
pub mod int_zp;
pub mod linear;
pub mod optim;
pub(crate) mod par;
pub mod qat;
pub(crate) mod range;
pub(crate) mod scales;
pub mod simd;
pub(crate) mod st;

#[cfg(feature = "python")]
mod python;
#[cfg(test)]
mod testutil;

pub use error::{GpuOptimError, QuantError, Result};
pub use int4::QuantizedWeight;
pub use linear::{PerTensorFP8Linear, QuantMethod, QuantizedSerde};
pub use optim::{Adam4bit, AdamW4bit, Optimizer, StatefulOptimizer};
pub use par::set_thread_limit;
pub use qat::{QatConfig, QatOptimizer};

/// The array crate of the public API (the version rust-numpy uses).
pub use ndarray;
/// The crate whose [`rand::Rng`] drives stochastic rounding.
pub use rand;

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
