//! `QatOptimizer`'s setters (a second `#[pymethods]` block): a live
//! optimizer takes new hyper-parameters without a copy of its state (on
//! either device), as a torch lr scheduler needs at every step, and a
//! restored step count and moments without going through the byte format
//! (docs/torch.md; on a device, through a host copy).

use pyo3::prelude::*;

use numpy::{Element, PyUntypedArrayMethods};

use super::enums::rounding_arg;
use super::optimizer::{Backend, Inner, PyQatOptimizer};
use crate::python::arrays::{check_shape, input};
use crate::qat::RoundingMode;
use crate::qat::{Master, QatOptimizer};
use crate::QuantError;

/// Apply `f` to the optimizer whatever its master dtype and device; on a
/// device the five hyper-parameters are set at once (`hyper` completes the
/// call from the current configuration).
macro_rules! each {
    ($self:expr, $o:ident => $body:expr, $c:ident => $dev:expr) => {
        on_backend!(&mut $self.backend, i => match i {
            Inner::F64($o) => $body,
            Inner::F32($o) => $body,
        }, $c => $dev)
    };
}

fn done(r: Result<(), QuantError>) -> PyResult<()> {
    Ok(r?)
}

fn set_moments_typed<T: Master + Element>(
    opt: &mut QatOptimizer<T>,
    shape: &[usize],
    step: u64,
    m: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (m, v) = (input::<T>(m, "m")?, input::<T>(v, "v")?);
    check_shape("m", m.shape(), shape)?;
    check_shape("v", v.shape(), shape)?;
    done(opt.set_moments(step, m.as_slice()?, v.as_slice()?))
}

#[pymethods]
impl PyQatOptimizer {
    /// Set the learning rate (finite, >= 0) of the next steps. Every setter
    /// validates first: an error names the argument and changes nothing.
    fn set_lr(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64,
    ) -> PyResult<()> {
        done(each!(self, o => o.set_lr(lr), d => d.reconfigure(|c| c.lr = lr)))
    }

    /// Set the moment decays (each in [0, 1); both or neither change).
    fn set_betas(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
    ) -> PyResult<()> {
        done(
            each!(self, o => o.set_betas(beta1, beta2), d => d.reconfigure(|c| (c.beta1, c.beta2) = (beta1, beta2))),
        )
    }

    /// Set epsilon (finite, > 0).
    fn set_eps(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::eps)] eps: f64,
    ) -> PyResult<()> {
        done(each!(self, o => o.set_eps(eps), d => d.reconfigure(|c| c.eps = eps)))
    }

    /// Set the decoupled weight decay (finite, >= 0).
    fn set_weight_decay(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
    ) -> PyResult<()> {
        done(
            each!(self, o => o.set_weight_decay(weight_decay), d => d.reconfigure(|c| c.weight_decay = weight_decay)),
        )
    }

    /// Set lr, beta1, beta2, eps and weight_decay at once (all or none change).
    fn set_hyper(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::eps)] eps: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
    ) -> PyResult<()> {
        done(
            each!(self, o => o.set_hyper(lr, beta1, beta2, eps, weight_decay), d => d.reconfigure(|c| (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) = (lr, beta1, beta2, eps, weight_decay))),
        )
    }

    /// Set the rounding of the next views (`"nearest"`, `"stochastic"` or a
    /// `RoundingMode`); the current view is kept.
    fn set_rounding(&mut self, rounding: &Bound<'_, PyAny>) -> PyResult<()> {
        let r: RoundingMode = rounding_arg(rounding)?;
        done(each!(self, o => o.set_rounding(r), d => {
            d.set_rounding(r);
            Ok(())
        }))
    }

    /// Set the seed (an int in [0, 2**64)) of the next steps' stochastic
    /// rounding streams.
    fn set_seed(&mut self, seed: &Bound<'_, PyAny>) -> PyResult<()> {
        let seed = super::rng::u64_arg(seed, "seed")?;
        each!(self, o => o.set_seed(seed), d => d.set_seed(seed));
        Ok(())
    }

    /// Replace the step count and the AdamW moments `m`, `v` (arrays of the
    /// master's shape and dtype; finite, `v >= 0`), as `moments()` returns
    /// them; the view is kept until the next step. On error nothing changes.
    fn set_moments(
        &mut self,
        #[pyo3(from_py_with = crate::python::sizes::step)] step: usize,
        m: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.with_host(m.py(), |i, shape| match i {
            Inner::F64(o) => set_moments_typed(o, shape, step as u64, m, v),
            Inner::F32(o) => set_moments_typed(o, shape, step as u64, m, v),
        })
    }
}
