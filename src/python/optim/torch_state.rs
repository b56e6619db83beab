//! One parameter's state in and out without the checkpoint's `meta` and
//! `config` (a second `#[pymethods]` block on both optimizer classes).
//!
//! `quantrs.torch` keeps one engine per parameter (named by `update(...,
//! name=...)`) and its state as fixed-size tensors in torch's state dict;
//! these methods move that state between the engine and NumPy arrays, and
//! retune a live engine's hyper-parameters, without re-creating the
//! checkpoint's meta document and CRC (docs/torch.md).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::backend::Backend;
use super::config::PyOptCfg;
use super::optimizer::{PyAdam4bit, PyAdamW4bit};
use super::state::{tensors_of, to_numpy, Inner};
use crate::error::QuantError;
use crate::optim::checkpoint;
use crate::optim::RowLayout;

/// The checkpoint key of the parameter `update` was given `name` for.
fn key_of(name: &str) -> String {
    format!("n:{name}")
}

/// `(step, {suffix: array})` of parameter `name`: `m_codes`, `v_codes`
/// (uint8) and the scales (float32), as `state_dict()` names them after
/// `n:<name>/`.
fn export<'py>(py: Python<'py>, inner: &Inner, name: &str) -> PyResult<(u64, Bound<'py, PyDict>)> {
    let key = key_of(name);
    let state = inner.core.state();
    let p = state.params.get(&key).ok_or_else(|| {
        QuantError::InvalidState(format!("name: no state for parameter {name:?}"))
    })?;
    let mut t = checkpoint::Tensors::new();
    checkpoint::put_param(&mut t, &key, p);
    let d = PyDict::new(py);
    let prefix = format!("{key}/");
    for (k, x) in t {
        d.set_item(&k[prefix.len()..], to_numpy(py, x)?)?;
    }
    Ok((state.step, d))
}

/// Replace the whole state with parameter `name` of `shape` at `step`.
fn import(
    inner: &mut Inner,
    name: &str,
    shape: Vec<usize>,
    step: u64,
    arrays: &Bound<'_, PyDict>,
) -> PyResult<()> {
    let key = key_of(name);
    let t = tensors_of(arrays, "arrays", &format!("{key}/"))?;
    checkpoint::load_param(&mut inner.core, &key, shape, step, t)?;
    inner.forget_params();
    Ok(())
}

macro_rules! torch_state {
    ($ty:ident) => {
        #[pymethods]
        impl $ty {
            /// `(step, arrays)`: the state of the parameter updated with
            /// `name=name` as NumPy arrays keyed `m_codes`, `v_codes`,
            /// `m_scales` / `m_scale_codes` + `m_scale_groups`, ... (copies).
            fn export_param_state<'py>(
                &self,
                py: Python<'py>,
                #[pyo3(from_py_with = crate::python::scalars::text::name)] name: String,
            ) -> PyResult<(u64, Bound<'py, PyDict>)> {
                self.backend.read_host(py, |i| export(py, i, &name))
            }

            /// Replace the state with one parameter `name` of `shape` at
            /// `step` from `export_param_state` arrays, checked as
            /// `load_state_dict` checks them (sizes against the bytes
            /// present before anything is allocated); the configuration is
            /// kept. On error nothing changes.
            fn import_param_state(
                &mut self,
                py: Python<'_>,
                #[pyo3(from_py_with = crate::python::scalars::text::name)] name: String,
                #[pyo3(from_py_with = crate::python::scalars::shape)] shape: Vec<usize>,
                #[pyo3(from_py_with = crate::python::sizes::step)] step: usize,
                arrays: &Bound<'_, PyDict>,
            ) -> PyResult<()> {
                self.backend.with_host(py, |i| import(i, &name, shape, step as u64, arrays))
            }

            /// Lay out the state of parameters created or imported from
            /// now on as rows `first_row..` of a parameter of `global_rows`
            /// rows, sharded on dim 0 (FSDP2; docs/torch.md "The sharded
            /// layout"): the parameter is given as `[local rows, row
            /// length]`, the row length a multiple of the block size, and no
            /// scale group crosses a row. CPU engines only; refused with
            /// rank-1 normalization. On error nothing changes.
            fn set_row_layout(
                &mut self,
                #[pyo3(from_py_with = crate::python::sizes::first_row)] first_row: usize,
                #[pyo3(from_py_with = crate::python::sizes::global_rows)] global_rows: usize,
            ) -> PyResult<()> {
                let layout = RowLayout {
                    first_row: first_row as u64,
                    global_rows: global_rows as u64,
                };
                on_backend!(&mut self.backend,
                    inner => Ok(inner.core.set_row_layout(Some(layout))?),
                    _c => Err(QuantError::UnsupportedOperation(
                        "set_row_layout: the row layout runs on the CPU only".into(),
                    )
                    .into()))
            }

            /// Set learning_rate, beta1, beta2, epsilon and weight_decay at
            /// once, validated as `Adam4bitOptimizerConfig` (all or none
            /// change); the state and the quantization are kept.
            fn set_hyper(
                &mut self,
                #[pyo3(from_py_with = crate::python::scalars::float::learning_rate)] learning_rate: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::epsilon)] epsilon: f64,
                #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
            ) -> PyResult<()> {
                let o = PyOptCfg::new(learning_rate, beta1, beta2, epsilon, weight_decay)?;
                self.backend.set_optimizer_config(o.inner)
            }
        }
    };
}

torch_state!(PyAdam4bit);
torch_state!(PyAdamW4bit);
