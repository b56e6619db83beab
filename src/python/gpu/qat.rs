//! `quantrs._core._CudaQat`: the device engine behind
//! `quantrs.cuda.QatOptimizer` (python/quantrs/cuda.py, which adds
//! construction from a master, `from_cpu` / `cpu()` and the setters that go
//! through the CPU code). Masters and gradients are CUDA arrays
//! (`DeviceArray`, or any CUDA DLPack producer) of the optimizer's dtype,
//! C-contiguous, on its device; the master is updated in place.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::array::{DType, DeviceArray};
use super::device::gpu;
use super::input::{cuda_ordinal, device_input, is_cuda_array};
use crate::error::QuantError;
use crate::gpu::memory::DeviceBuffer;
use crate::gpu::qat::DevMaster;
use crate::gpu::qat_engine::DeviceQat;
use crate::python::errors::invalid;
use crate::python::qat::{rounding_arg, seed_arg, PyQatConfig, PyQuantParams, PyRng};
use crate::python::scalars::with_bytes;
use crate::python::sizes::int_in;
use crate::qat::serde::dtype_tag;
use crate::qat::QatOptimizer;

enum Engine {
    F32(DeviceQat<f32>),
    F64(DeviceQat<f64>),
}

/// Apply `f` to the engine whatever its master dtype.
macro_rules! each {
    ($inner:expr, $e:ident => $body:expr) => {
        match $inner {
            Engine::F32($e) => $body,
            Engine::F64($e) => $body,
        }
    };
}

/// `QatOptimizer` with its moments and view on a CUDA device.
#[pyclass(name = "_CudaQat", module = "quantrs.cuda")]
pub struct CudaQat {
    inner: Engine,
    shape: Vec<usize>,
}

fn device_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    int_in(obj, "device", 0, i32::MAX.into()).map(|v| v as usize)
}

/// A CPU optimizer from its bytes, checked against `shape`.
fn cpu_from<T: DevMaster>(bytes: &[u8], shape: &[usize]) -> PyResult<QatOptimizer<T>> {
    let o = QatOptimizer::<T>::from_bytes(bytes)?;
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if count != Some(o.len()) {
        return Err(QuantError::ser(format!(
            "shape {shape:?} does not hold the state's {} elements",
            o.len()
        ))
        .into());
    }
    Ok(o)
}

impl CudaQat {
    fn dtype(&self) -> DType {
        match self.inner {
            Engine::F32(_) => DType::F32,
            Engine::F64(_) => DType::F64,
        }
    }

    fn ordinal(&self) -> usize {
        each!(&self.inner, e => e.gpu().ordinal)
    }

    /// A CUDA array of this optimizer's dtype and shape on its device.
    fn operand<'py>(
        &self,
        obj: &Bound<'py, PyAny>,
        arg: &str,
    ) -> PyResult<super::input::DevInput<'py>> {
        if !is_cuda_array(obj)? {
            return Err(QuantError::arg(format!(
                "{arg} is on the host but the optimizer is on cuda:{}: pass a CUDA array \
                 (quantrs.cuda.DeviceArray, a torch.cuda tensor, a CuPy array)",
                self.ordinal()
            ))
            .into());
        }
        let on = cuda_ordinal(obj)?;
        if on != self.ordinal() {
            return Err(QuantError::arg(format!(
                "{arg} is on cuda:{on} but the optimizer is on cuda:{}",
                self.ordinal()
            ))
            .into());
        }
        let g = each!(&self.inner, e => e.gpu().clone());
        let d = device_input(&g, obj, arg, self.dtype(), "the optimizer")?;
        if d.shape != self.shape {
            return Err(QuantError::dims(
                arg,
                format!("{:?}", self.shape),
                format!("{:?}", d.shape),
            )
            .into());
        }
        Ok(d)
    }

    fn array(&self, buf: std::sync::Arc<DeviceBuffer>) -> DeviceArray {
        DeviceArray {
            buf,
            shape: self.shape.clone(),
            dtype: self.dtype(),
        }
    }
}

#[pymethods]
impl CudaQat {
    /// The optimizer whose state is `state` (`QatOptimizer.to_bytes()`) for
    /// a master of `shape`, on CUDA device `device`.
    #[new]
    #[pyo3(signature = (state, shape, device = 0))]
    fn new(
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::shape)] shape: Vec<usize>,
        #[pyo3(from_py_with = device_arg)] device: usize,
    ) -> PyResult<Self> {
        let state = with_bytes(state, "state", <[u8]>::to_vec)?;
        let g = gpu(py, device)?;
        let inner = match dtype_tag(&state)? {
            2 => {
                let o = cpu_from::<f64>(&state, &shape)?;
                Engine::F64(py.detach(|| DeviceQat::from_cpu(&g, &o))?)
            }
            _ => {
                let o = cpu_from::<f32>(&state, &shape)?;
                Engine::F32(py.detach(|| DeviceQat::from_cpu(&g, &o))?)
            }
        };
        Ok(CudaQat { inner, shape })
    }

    /// One AdamW step on `master` in place, then a new view; `rng` (an int
    /// or a `quantrs.Rng`, advanced only on success) overrides the stream
    /// seed for this step. Transactional: on error nothing changes.
    #[pyo3(signature = (master, grad, rng = None))]
    fn step(
        &mut self,
        py: Python<'_>,
        master: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        rng: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut w = self.operand(master, "master")?;
        let g = self.operand(grad, "grad")?;
        let bytes = (self.shape.iter().product::<usize>() * self.dtype().size()) as u64;
        if w.ptr < g.ptr + bytes && g.ptr < w.ptr + bytes {
            return Err(invalid(
                "grad",
                "overlaps the master array (it is updated in place)",
            ));
        }
        let generator = rng.and_then(|r| r.cast::<PyRng>().ok());
        let saved = generator.map(|g| g.borrow().inner);
        let seed = seed_arg(rng)?;
        let inner = &mut self.inner;
        let res = match inner {
            Engine::F32(e) => {
                let (mut wv, gv) = (w.view_mut::<f32>()?, g.view::<f32>()?);
                py.detach(|| {
                    e.step(&mut wv, &gv, seed)
                        .and_then(|_| e.gpu().synchronize())
                })
            }
            Engine::F64(e) => {
                let (mut wv, gv) = (w.view_mut::<f64>()?, g.view::<f64>()?);
                py.detach(|| {
                    e.step(&mut wv, &gv, seed)
                        .and_then(|_| e.gpu().synchronize())
                })
            }
        };
        if let (Err(_), Some(g), Some(state)) = (&res, generator, saved) {
            g.borrow_mut().inner = state;
        }
        Ok(res?)
    }

    /// The fake-quantized view: a `DeviceArray` over the optimizer's own
    /// buffer (every step rewrites it in place).
    #[getter]
    fn quantized_weights(&self) -> DeviceArray {
        self.array(each!(&self.inner, e => e.view()))
    }

    /// Device copies of the AdamW moments `(m, v)`.
    fn moments(&self, py: Python<'_>) -> PyResult<(DeviceArray, DeviceArray)> {
        let inner = &self.inner;
        let (m, v) = py.detach(
            || each!(inner, e => e.moments().and_then(|mv| e.gpu().synchronize().map(|_| mv))),
        )?;
        Ok((self.array(m.into()), self.array(v.into())))
    }

    fn quant_params(&self) -> Option<PyQuantParams> {
        each!(&self.inner, e => e.quant_params()).map(PyQuantParams::wrap)
    }

    fn step_count(&self) -> u64 {
        each!(&self.inner, e => e.scalars().step)
    }

    #[getter]
    fn config(&self) -> PyQatConfig {
        PyQatConfig {
            inner: each!(&self.inner, e => e.scalars().config),
        }
    }

    #[getter]
    fn seed(&self) -> u64 {
        each!(&self.inner, e => e.scalars().seed)
    }

    /// `"float32"` or `"float64"`.
    #[getter]
    fn dtype_name(&self) -> &'static str {
        self.dtype().name()
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    #[getter]
    fn device(&self) -> String {
        format!("cuda:{}", self.ordinal())
    }

    /// The state as bytes: exactly `QatOptimizer.to_bytes()` of the CPU
    /// optimizer holding this state.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &self.inner;
        let b = py.detach(|| each!(inner, e => e.to_cpu().map(|o| o.to_bytes())))?;
        Ok(PyBytes::new(py, &b))
    }

    /// Replace the whole state by `state` (same dtype and length; checked
    /// on the host first, unchanged on error).
    fn load_bytes(&mut self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = with_bytes(state, "state", <[u8]>::to_vec)?;
        let shape = self.shape.clone();
        match &mut self.inner {
            Engine::F32(e) => {
                let o = cpu_from::<f32>(&state, &shape)?;
                py.detach(|| e.load(&o).and_then(|_| e.gpu().synchronize()))?;
            }
            Engine::F64(e) => {
                let o = cpu_from::<f64>(&state, &shape)?;
                py.detach(|| e.load(&o).and_then(|_| e.gpu().synchronize()))?;
            }
        }
        Ok(())
    }

    /// Device bytes held: moments, view and the step's scratch.
    fn memory_usage(&self) -> usize {
        each!(&self.inner, e => e.device_bytes())
    }

    /// All five AdamW hyper-parameters (validated first; all or none).
    fn set_hyper(
        &mut self,
        #[pyo3(from_py_with = crate::python::scalars::float::lr)] lr: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta1)] beta1: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::beta2)] beta2: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::eps)] eps: f64,
        #[pyo3(from_py_with = crate::python::scalars::float::weight_decay)] weight_decay: f64,
    ) -> PyResult<()> {
        Ok(each!(&mut self.inner, e => e.set_hyper(lr, beta1, beta2, eps, weight_decay))?)
    }

    fn set_rounding(&mut self, rounding: &Bound<'_, PyAny>) -> PyResult<()> {
        let r = rounding_arg(rounding)?;
        each!(&mut self.inner, e => e.set_rounding(r));
        Ok(())
    }

    fn set_seed(&mut self, seed: u64) {
        each!(&mut self.inner, e => e.set_seed(seed));
    }

    fn __len__(&self) -> usize {
        each!(&self.inner, e => e.len())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CudaQat>()?;
    super::qat_calibrate::register(m)
}
