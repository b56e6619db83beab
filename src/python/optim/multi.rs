//! `quantrs._core.adam4bit_multi_step`: one call updates a list of
//! parameters, each with its own host engine (`crate::optim::multi`), with
//! the GIL released once for the whole list. The torch adapter's step
//! (`quantrs.torch._adam_multi`) calls it once per parameter group.

use pyo3::prelude::*;

use super::backend::Backend;
use super::config::PyOptCfg;
use super::optimizer::{PyAdam4bit, PyAdamW4bit};
use super::state::Pair;
use crate::optim::{step_all, StepItem};
use crate::optim::{Adam4bitOptimizerConfig, ParamMut};
use crate::python::arrays::overlaps;
use crate::python::errors::{invalid, wrong_type};

/// A borrowed engine of either class.
enum Engine<'py> {
    Adam(PyRefMut<'py, PyAdam4bit>),
    AdamW(PyRefMut<'py, PyAdamW4bit>),
}

impl Engine<'_> {
    fn backend(&mut self) -> &mut Backend {
        match self {
            Engine::Adam(e) => &mut e.backend,
            Engine::AdamW(e) => &mut e.backend,
        }
    }
}

fn engine<'py>(i: usize, obj: &Bound<'py, PyAny>) -> PyResult<Engine<'py>> {
    let what = format!("engines[{i}]");
    let e = if let Ok(e) = obj.cast::<PyAdamW4bit>() {
        Engine::AdamW(e.try_borrow_mut().map_err(|e| invalid(&what, e))?)
    } else if let Ok(e) = obj.cast::<PyAdam4bit>() {
        Engine::Adam(e.try_borrow_mut().map_err(|e| invalid(&what, e))?)
    } else {
        return Err(wrong_type(
            &what,
            "quantrs.Adam4bit or quantrs.AdamW4bit",
            obj,
        ));
    };
    Ok(e)
}

/// `err` with `where_` in front of its message, the same exception type.
fn located(py: Python<'_>, where_: &str, err: PyErr) -> PyErr {
    let msg = err.value(py).to_string();
    PyErr::from_type(err.get_type(py), format!("{where_}: {msg}"))
}

/// One validated config per engine from `hyper`: one
/// `(lr, beta1, beta2, eps, weight_decay)` tuple for all, or a list of `n`.
fn hypers_of(
    py: Python<'_>,
    hyper: &Bound<'_, PyAny>,
    n: usize,
) -> PyResult<Vec<Adam4bitOptimizerConfig>> {
    type Hyper = (f64, f64, f64, f64, f64);
    let (list, one) = match hyper.extract::<Hyper>() {
        Ok(h) => (vec![h; n], true),
        Err(_) => match hyper.extract::<Vec<Hyper>>() {
            Ok(l) if l.len() == n => (l, false),
            _ => {
                return Err(wrong_type(
                    "hyper",
                    &format!("a (lr, beta1, beta2, eps, weight_decay) tuple or a list of {n}"),
                    hyper,
                ))
            }
        },
    };
    let mut out = Vec::with_capacity(n);
    for (i, (lr, b1, b2, eps, wd)) in list.into_iter().enumerate() {
        let what = if one {
            "hyper".to_string()
        } else {
            format!("hyper[{i}]")
        };
        let c = PyOptCfg::new(lr, b1, b2, eps, wd).map_err(|e| located(py, &what, e))?;
        out.push(c.inner);
        if one {
            return Ok(vec![out[0]; n]);
        }
    }
    Ok(out)
}

/// Update `params[i]` in place with `grads[i]` through `engines[i]`, then
/// advance each engine's step counter: `engines[i].update(params[i],
/// grads[i], name=name); engines[i].step()` for every i, with the same
/// results, in one call. `hyper` (one `(lr, beta1, beta2, eps,
/// weight_decay)` for all, or a list with one per engine) replaces the
/// engines' hyper-parameters first. Everything is validated
/// before anything changes; an error names the list index.
#[pyfunction]
#[pyo3(signature = (engines, params, grads, *, name=None, hyper=None))]
pub(super) fn adam4bit_multi_step(
    py: Python<'_>,
    engines: Vec<Bound<'_, PyAny>>,
    params: Vec<Bound<'_, PyAny>>,
    grads: Vec<Bound<'_, PyAny>>,
    #[pyo3(from_py_with = crate::python::scalars::opt_text::name)] name: Option<String>,
    hyper: Option<Bound<'_, PyAny>>,
) -> PyResult<()> {
    let n = engines.len();
    for (what, len) in [("params", params.len()), ("grads", grads.len())] {
        if len != n {
            return Err(invalid(
                what,
                format!("expected {n} arrays (one per engine), got {len}"),
            ));
        }
    }
    let hypers = match hyper {
        Some(h) => Some(hypers_of(py, &h, n)?),
        None => None,
    };
    let mut refs = Vec::with_capacity(n);
    let mut pairs = Vec::with_capacity(n);
    for (i, ((e, p), g)) in engines.iter().zip(&params).zip(&grads).enumerate() {
        let mut e = engine(i, e)?;
        if !matches!(e.backend(), Backend::Cpu(_)) {
            return Err(invalid(
                &format!("engines[{i}]"),
                "expected an engine on the cpu (a CUDA engine steps with update())",
            ));
        }
        refs.push(e);
        pairs.push(Pair::new(p, g).map_err(|e| located(py, &format!("params[{i}]"), e))?);
    }
    let mut slices = Vec::with_capacity(n);
    for (i, pair) in pairs.iter_mut().enumerate() {
        let (p, g, shape) = pair
            .slices()
            .map_err(|e| located(py, &format!("params[{i}]"), e))?;
        slices.push((p, g, shape));
    }
    // Every parameter is written: none may share memory with another
    // parameter or with any gradient.
    for i in 0..n {
        for j in 0..n {
            let (pi, pj, gj) = (&slices[i].0, &slices[j].0, slices[j].1);
            if (i != j && overlaps(pi, pj)) || overlaps(pi, gj) {
                return Err(invalid(
                    &format!("params[{i}]"),
                    format!("must not share memory with params[{j}] or grads[{j}]"),
                ));
            }
        }
    }
    let mut cores = Vec::with_capacity(n);
    for r in refs.iter_mut() {
        match r.backend() {
            Backend::Cpu(inner) => cores.push(&mut inner.core),
            #[cfg(feature = "gpu")]
            Backend::Cuda(_) => unreachable!("checked above"),
        }
    }
    let saved: Vec<Adam4bitOptimizerConfig> = cores.iter().map(|c| c.config().optimizer).collect();
    if let Some(hs) = hypers {
        for (c, o) in cores.iter_mut().zip(hs) {
            c.set_optimizer_config(o)?;
        }
    }
    let name = name.as_deref();
    let mut items: Vec<StepItem<'_>> = cores
        .into_iter()
        .zip(slices)
        .map(|(core, (p, g, shape))| StepItem {
            core,
            param: ParamMut {
                name,
                shape,
                data: p,
            },
            grad: g,
        })
        .collect();
    let result = py.detach(|| step_all(&mut items));
    if let Err((i, e)) = result {
        for (it, o) in items.iter_mut().zip(saved) {
            it.core.set_optimizer_config(o)?;
        }
        return Err(located(py, &format!("params[{i}]"), e.into()));
    }
    Ok(())
}
