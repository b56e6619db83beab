//! Bindings of `crate::qat` (docs/qat.md): the enum classes, `QatConfig`,
//! `Rng`, `QuantParams` with the free functions behind `quantrs.qat`, and
//! `QatOptimizer`.
//!
//! One way down: `optimizer.rs` -> `params.rs` -> `config.rs`, `rng.rs`,
//! `convert.rs` -> `enums.rs`.

mod config;
mod convert;
mod enums;
mod hyper;
mod optimizer;
mod params;
mod rng;

use pyo3::prelude::*;

// What the device calibration's binding (`python/gpu/qat_calibrate.rs`) shares.
#[cfg(feature = "gpu")]
pub(crate) use enums::{int_dtype, scheme_arg, target_arg};
#[cfg(feature = "gpu")]
pub(crate) use params::PyQuantParams;

/// Add the QAT classes and functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<enums::PyQuantTarget>()?;
    m.add_class::<enums::PyQuantScheme>()?;
    m.add_class::<enums::PyRoundingMode>()?;
    m.add_class::<config::PyQatConfig>()?;
    m.add_class::<rng::PyRng>()?;
    params::register(m)?;
    optimizer::register(m)?;
    Ok(())
}
