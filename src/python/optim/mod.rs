//! Bindings of `quantrs.Adam4bit` / `quantrs.AdamW4bit` and their config and
//! statistics classes (docs/optim.md). Validation and conversion only; the
//! numerics are in `crate::optim`.
//!
//! One way down: `optimizer.rs` (the two classes) -> `state.rs` (what both
//! hold: update, accumulation, checkpoints) -> `config.rs` (the config
//! classes, `QuantizationMethod`, float conversions) and `stats.rs`.

mod config;
mod optimizer;
mod state;
mod stats;
mod torch_state;

// `to(device)` is added by the GPU bindings (src/python/gpu.rs).
pub(crate) use optimizer::{PyAdam4bit, PyAdamW4bit};

use pyo3::prelude::*;

/// Add the optimizer classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::PyMethod>()?;
    m.add_class::<config::PyOptCfg>()?;
    m.add_class::<config::PyQCfg>()?;
    m.add_class::<config::PyAdamCfg>()?;
    m.add_class::<stats::PyStats>()?;
    m.add_class::<stats::PyState>()?;
    m.add_class::<optimizer::PyAdam4bit>()?;
    m.add_class::<optimizer::PyAdamW4bit>()?;
    Ok(())
}
