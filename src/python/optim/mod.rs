//! Bindings of `quantrs.Adam4bit` / `quantrs.AdamW4bit` and their config and
//! statistics classes (docs/optim.md). Validation and conversion only; the
//! numerics are in `crate::optim`.
//!
//! One way down: `multi.rs` (one step over a list of engines) ->
//! `optimizer.rs` (the two classes) and `torch_state.rs`
//! (their per-parameter methods) -> `backend.rs` (host or device state) ->
//! `state.rs` (the host state: update, accumulation, checkpoints) ->
//! `config.rs` (the config classes, `QuantizationMethod`, float
//! conversions) and `stats.rs`. The device state is `python/gpu/optim.rs`.

mod backend;
mod config;
mod multi;
mod optimizer;
mod state;
mod stats;
mod torch_state;

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
    m.add_function(wrap_pyfunction!(multi::adam4bit_multi_step, m)?)?;
    Ok(())
}
