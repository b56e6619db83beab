//! `Inner`, what both optimizer classes hold, and the work they share:
//! array validation around `update` / `accumulate_grad`, state dicts,
//! `config()`, `state()` and `repr`.

use std::collections::HashMap;

use numpy::{
    PyArray1, PyArrayMethods, PyReadonlyArrayDyn, PyReadwriteArrayDyn, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::config::{PyOptCfg, PyQCfg};
use super::stats::PyState;
use crate::error::QuantError;
use crate::optim::{
    checkpoint, Adam4bitConfig, Adam4bitCore, AdvancedQuantizationConfig as CoreQCfg, ParamMut,
    ParamRef,
};
use crate::python::arrays::{check_shape, inplace, input, overlaps};
use crate::python::errors::invalid;
use crate::python::fields::{class_repr, fields_repr, set_fields};
use crate::st::{Dtype, OwnedTensor};

/// A parameter and its gradient, validated for `update` and
/// `accumulate_grad`: `param` a writable C-contiguous float32 array (it is
/// updated, now or by `apply_accumulated_grads`), `grad` any float32
/// array-like of the same shape.
pub(super) struct Pair<'py> {
    param: PyReadwriteArrayDyn<'py, f32>,
    grad: PyReadonlyArrayDyn<'py, f32>,
    shape: Vec<usize>,
}

impl<'py> Pair<'py> {
    /// Validate `grad`, then `param`, then their shapes.
    pub(super) fn new(param: &Bound<'py, PyAny>, grad: &Bound<'py, PyAny>) -> PyResult<Self> {
        let grad = input::<f32>(grad, "grad")?;
        let param = inplace::<f32>(param, "param")?;
        let shape = param.shape().to_vec();
        check_shape("grad", grad.shape(), &shape)?;
        Ok(Pair { param, grad, shape })
    }

    /// The parameter's values (written), the gradient's, and the shape.
    pub(super) fn slices(&mut self) -> PyResult<(&mut [f32], &[f32], &[usize])> {
        let g = self.grad.as_slice().map_err(|e| invalid("grad", e))?;
        let p = self.param.as_slice_mut().map_err(|e| invalid("param", e))?;
        Ok((p, g, &self.shape))
    }
}

/// A checkpoint tensor as a NumPy array (uint8, or float32 from its
/// little-endian bytes), in its shape.
pub(super) fn to_numpy<'py>(py: Python<'py>, x: OwnedTensor) -> PyResult<Bound<'py, PyAny>> {
    Ok(match x.dtype {
        Dtype::U8 => PyArray1::from_vec(py, x.data).reshape(x.shape)?.into_any(),
        _ => PyArray1::from_vec(py, crate::st::le_to_f32(&x.data)?)
            .reshape(x.shape)?
            .into_any(),
    })
}

/// The str-keyed NumPy arrays (uint8 or float32) of `arrays` as checkpoint
/// tensors named `prefix + key`; `what` names the dict in errors.
pub(super) fn tensors_of(
    arrays: &Bound<'_, PyDict>,
    what: &str,
    prefix: &str,
) -> PyResult<checkpoint::Tensors> {
    let mut t = checkpoint::Tensors::new();
    for (k, v) in arrays.iter() {
        let name: String = k
            .extract()
            .map_err(|_| QuantError::ser(format!("{what}: keys must be str")))?;
        let tensor = if let Ok(a) = v.cast::<numpy::PyArrayDyn<u8>>() {
            let r = a.try_readonly().map_err(|e| invalid(&name, e))?;
            OwnedTensor {
                dtype: Dtype::U8,
                shape: r.shape().to_vec(),
                data: r.as_array().iter().copied().collect(),
            }
        } else if let Ok(a) = v.cast::<numpy::PyArrayDyn<f32>>() {
            let r = a.try_readonly().map_err(|e| invalid(&name, e))?;
            let vals: Vec<f32> = r.as_array().iter().copied().collect();
            OwnedTensor {
                dtype: Dtype::F32,
                shape: r.shape().to_vec(),
                data: crate::st::f32_to_le(&vals),
            }
        } else {
            // Name the dtype of an array of the wrong dtype, the type otherwise.
            let got = match v.cast::<numpy::PyUntypedArray>() {
                Ok(u) => format!("dtype {}", u.dtype()),
                Err(_) => v.get_type().name()?.to_string(),
            };
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "{what}[{name:?}]: expected a numpy array of dtype uint8 or float32, got {got}"
            )));
        };
        t.insert(format!("{prefix}{name}"), tensor);
    }
    Ok(t)
}

/// What both optimizer classes hold: the core and, for pending gradient
/// accumulation, the parameter arrays to update.
pub(super) struct Inner {
    pub(super) core: Adam4bitCore,
    /// Key -> the parameter array `apply_accumulated_grads` will update.
    accum_params: HashMap<String, Py<PyAny>>,
}

impl Inner {
    /// A fresh optimizer (defaults for the configs not given).
    pub(super) fn build(
        opt: Option<PyOptCfg>,
        q: Option<PyQCfg>,
        decoupled: bool,
    ) -> PyResult<Inner> {
        let config = Adam4bitConfig {
            optimizer: opt.map(|c| c.inner).unwrap_or_default(),
            quantization: q.map(|c| c.inner).unwrap_or_default(),
        };
        Ok(Inner::of(Adam4bitCore::new(config, decoupled)?))
    }

    /// An optimizer around `core`, with nothing accumulated.
    pub(super) fn of(core: Adam4bitCore) -> Inner {
        Inner {
            core,
            accum_params: HashMap::new(),
        }
    }

    /// Forget the parameters of pending accumulation (the core has
    /// dropped its accumulators).
    pub(super) fn forget_params(&mut self) {
        self.accum_params.clear();
    }

    /// `update(param, grad)`: one step, GIL released. (The slice form, not
    /// the ndarray `Optimizer::update`: that trait has no `name=` to key the state by.)
    pub(super) fn update(
        &mut self,
        py: Python<'_>,
        mut pair: Pair<'_>,
        name: Option<&str>,
    ) -> PyResult<()> {
        let gs = pair.grad.as_slice().map_err(|e| invalid("grad", e))?;
        let ps = pair.param.as_slice_mut().map_err(|e| invalid("param", e))?;
        if overlaps(ps, gs) {
            return Err(invalid("grad", "must not share memory with param"));
        }
        let (core, shape) = (&mut self.core, &pair.shape);
        py.detach(|| {
            core.update(
                ParamMut {
                    name,
                    shape,
                    data: ps,
                },
                gs,
            )
        })?;
        Ok(())
    }

    /// `accumulate_grad(param, grad)`: add the gradient to the key's
    /// accumulator and remember `param` (updated by `apply_accumulated`).
    pub(super) fn accumulate(
        &mut self,
        py: Python<'_>,
        param: &Bound<'_, PyAny>,
        pair: Pair<'_>,
        name: Option<&str>,
    ) -> PyResult<()> {
        let gs = pair.grad.as_slice().map_err(|e| invalid("grad", e))?;
        let ps = pair.param.as_slice().map_err(|e| invalid("param", e))?;
        let (core, shape) = (&mut self.core, &pair.shape);
        let key = py.detach(|| {
            core.accumulate_grad(
                ParamRef {
                    name,
                    shape,
                    data: ps,
                },
                gs,
            )
        })?;
        self.accum_params.insert(key, param.clone().unbind());
        Ok(())
    }

    /// `apply_accumulated_grads(steps)`: one step per recorded parameter with
    /// the mean accumulated gradient.
    pub(super) fn apply_accumulated(&mut self, py: Python<'_>, steps: usize) -> PyResult<()> {
        let keys = self.core.accumulated_keys();
        let mut arrays = Vec::with_capacity(keys.len());
        for k in &keys {
            let obj = self.accum_params.get(k).ok_or_else(|| {
                QuantError::InvalidState(format!("no parameter recorded for {k:?}"))
            })?;
            arrays.push(inplace::<f32>(obj.bind(py), "param")?);
        }
        let shapes: Vec<Vec<usize>> = arrays.iter().map(|a| a.shape().to_vec()).collect();
        let mut params = Vec::with_capacity(keys.len());
        for ((k, a), s) in keys.iter().zip(arrays.iter_mut()).zip(&shapes) {
            let data = a.as_slice_mut().map_err(|e| invalid("param", e))?;
            params.push((
                k.clone(),
                ParamMut {
                    name: None,
                    shape: s,
                    data,
                },
            ));
        }
        let core = &mut self.core;
        py.detach(|| core.apply_accumulated_grads(steps, &mut params))?;
        self.forget_params();
        Ok(())
    }

    /// The state as NumPy arrays (uint8 codes, float32 scales and scalars).
    pub(super) fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = checkpoint::to_tensors(&self.core)?;
        let d = PyDict::new(py);
        for (name, x) in t {
            d.set_item(name, to_numpy(py, x)?)?;
        }
        Ok(d)
    }

    /// Replace the state from `state_dict()` arrays (validated first).
    pub(super) fn load_state_dict(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let t = tensors_of(state, "state_dict", "")?;
        checkpoint::load_tensors(&mut self.core, t)?;
        self.forget_params();
        Ok(())
    }

    /// The `OptimizerState` summary.
    pub(super) fn state(&self, py: Python<'_>) -> PyResult<PyState> {
        let s = self.core.state();
        let d = PyDict::new(py);
        for (k, p) in &s.params {
            d.set_item(k, PyTuple::new(py, &p.shape)?)?;
        }
        Ok(PyState {
            step: s.step,
            params: d.unbind(),
            total_bytes: s.bytes(),
        })
    }
}

/// Every hyper-parameter and quantization setting of `c` as one dict.
pub(super) fn config_dict<'py>(
    py: Python<'py>,
    c: &Adam4bitConfig,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    set_fields(&d, &c.optimizer)?;
    set_fields(&d, &c.quantization)?;
    Ok(d)
}

/// The repr of an optimizer of class `cls` with configuration `c`: the call
/// that rebuilds it (with `.to(device)` when it is not on the host).
pub(super) fn repr(cls: &str, c: &Adam4bitConfig, device: &str) -> String {
    let head = fields_repr(&c.optimizer);
    let call = if c.quantization == CoreQCfg::default() {
        format!("{cls}({head})")
    } else {
        format!(
            "{cls}.with_quantization_config({}, {})",
            class_repr(&c.optimizer),
            class_repr(&c.quantization)
        )
    };
    if device == "cpu" {
        call
    } else {
        format!("{call}.to('{device}')")
    }
}
