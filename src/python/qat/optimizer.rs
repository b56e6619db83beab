//! `QatOptimizer` binding: in-place master update, zero-copy read-only view.
//! The state lives on the host (`Inner`) or on a CUDA device (`CudaQat`, in
//! a `gpu` build); `.to(device)` moves it in place through the byte format.

use numpy::ndarray::{ArrayView, IxDyn};
use numpy::{Element, PyArray, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use super::config::PyQatConfig;
use super::convert::to_array;
use super::enums::target_arg;
use super::params::PyQuantParams;
use super::rng::{seed_arg, PyRng};
use crate::linear::Device;
use crate::python::arrays::{check_shape, inplace, input, numpy_module, overlaps};
use crate::python::errors::{wrong_dtype, wrong_type};
use crate::python::fields::class_repr;
use crate::qat::{CounterRng, Master, QatConfig, QatGrid, QatOptimizer};
use crate::QuantError;

#[derive(Clone)]
pub(super) enum Inner {
    F64(QatOptimizer<f64>),
    F32(QatOptimizer<f32>),
}

/// Where the state lives: the host, or a CUDA device.
pub(super) enum Backend {
    Cpu(Inner),
    #[cfg(feature = "gpu")]
    Cuda(crate::python::gpu::CudaQat),
}

/// AdamW on full-precision master weights with a fake-quantized view.
///
/// The master stays owned by the caller and is updated in place by
/// `step`; the optimizer owns the moments and the view.
#[pyclass(module = "quantrs", name = "QatOptimizer")]
pub struct PyQatOptimizer {
    pub(super) backend: Backend,
    pub(super) shape: Vec<usize>,
}

fn config_arg(obj: &Bound<'_, PyAny>) -> PyResult<QatConfig> {
    if let Ok(c) = obj.cast::<PyQatConfig>() {
        return Ok(c.get().inner);
    }
    if obj.extract::<String>().is_ok() {
        return Ok(QatConfig::with_target(target_arg(obj)?));
    }
    Err(wrong_type(
        "config",
        "a quantrs.QatConfig or a target string",
        obj,
    ))
}

fn dtype_of(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<&'static str> {
    let Ok(u) = obj.cast::<PyUntypedArray>() else {
        return Err(wrong_type(
            arg,
            "a numpy.ndarray of dtype float64 or float32",
            obj,
        ));
    };
    let py = obj.py();
    let d = u.dtype();
    if d.is_equiv_to(&numpy::dtype::<f64>(py)) {
        Ok("float64")
    } else if d.is_equiv_to(&numpy::dtype::<f32>(py)) {
        Ok("float32")
    } else {
        Err(wrong_dtype(arg, "float64 or float32", d))
    }
}

/// The `grid` argument: `"tensor"` or `"deploy"` (the deploy grid's shape
/// comes from the master).
fn grid_arg(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    match crate::python::scalars::str_arg(obj, "grid")?.as_str() {
        "tensor" => Ok(false),
        "deploy" => Ok(true),
        g => Err(QuantError::arg(format!("grid: expected 'tensor' or 'deploy', got {g:?}")).into()),
    }
}

/// The grid of a master of `shape`: a deploy grid needs `[out, in]`.
fn grid_for(deploy: bool, shape: &[usize], group_size: usize) -> PyResult<QatGrid> {
    match (deploy, shape) {
        (false, _) => Ok(QatGrid::PerTensor),
        (true, &[o, i]) => Ok(QatGrid::deploy(o, i, group_size)),
        (true, s) => Err(QuantError::arg(format!(
            "master: grid='deploy' expects a 2-D weight [out_features, in_features], got shape {}",
            shape_str(s)
        ))
        .into()),
    }
}

fn build<T: Master + Element>(
    py: Python<'_>,
    master: &Bound<'_, PyAny>,
    config: QatConfig,
    seed: u64,
    (deploy, group_size): (bool, usize),
) -> PyResult<(QatOptimizer<T>, Vec<usize>)> {
    let a = input::<T>(master, "master")?;
    let grid = grid_for(deploy, a.shape(), group_size)?;
    let xs = a.as_slice()?;
    let opt = py.detach(|| QatOptimizer::with_grid(xs, config, grid, seed))?;
    Ok((opt, a.shape().to_vec()))
}

fn step_typed<T: Master + Element>(
    py: Python<'_>,
    opt: &mut QatOptimizer<T>,
    shape: &[usize],
    master: &Bound<'_, PyAny>,
    grad: &Bound<'_, PyAny>,
    seed: Option<u64>,
) -> PyResult<()> {
    if master.is(grad) {
        return Err(
            QuantError::arg("grad: the master array was passed as its own gradient").into(),
        );
    }
    // A view of the master (reversed, strided, ...) would be converted to a
    // copy below and slip past the borrow checker: compare memory bounds.
    if grad.cast::<PyUntypedArray>().is_ok() && master.cast::<PyUntypedArray>().is_ok() {
        let share = numpy_module(py)?.call_method1("may_share_memory", (master, grad))?;
        if share.is_truthy()? {
            return Err(QuantError::arg(
                "grad: overlaps the master array (it is updated in place)",
            )
            .into());
        }
    }
    let g = input::<T>(grad, "grad")?;
    let mut w = inplace::<T>(master, "master")?;
    check_shape("master", w.shape(), shape)?;
    check_shape("grad", g.shape(), shape)?;
    let gs = g.as_slice()?;
    let ws = w.as_slice_mut()?;
    if overlaps(ws, gs) {
        return Err(QuantError::arg("grad: overlaps the master array").into());
    }
    py.detach(|| opt.step_seeded(ws, gs, seed))?;
    Ok(())
}

/// A read-only NumPy view of `data` whose base is `owner`.
fn view<'py, T: Element>(
    owner: &Bound<'py, PyQatOptimizer>,
    data: &[T],
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let v = ArrayView::from_shape(IxDyn(shape), data)
        .map_err(|e| QuantError::InvalidState(format!("view shape: {e}")))?;
    // SAFETY: `data` is a buffer of the optimizer inside `owner`, which the
    // array keeps alive as its base. The buffer is allocated once, never
    // resized or replaced for the object's life (steps write in place), so
    // the pointer stays valid for as long as the array exists.
    let arr: Bound<'py, PyArray<T, IxDyn>> =
        unsafe { PyArray::borrow_from_array(&v, owner.clone().into_any()) };
    let kw = PyDict::new(owner.py());
    kw.set_item("write", false)?;
    arr.call_method("setflags", (), Some(&kw))?;
    Ok(arr.into_any())
}

#[pymethods]
impl PyQatOptimizer {
    /// An optimizer for the float64 or float32 `master` (shape and dtype are
    /// fixed from here on); `config` is a `QatConfig` or a target string,
    /// `rng` seeds stochastic rounding (None: fresh entropy). `grid="deploy"`
    /// puts the view of a 2-D `[out, in]` master on its serving layer's grid
    /// (int4: `group_size` inputs per scale; docs/qat.md "Deploy grid").
    #[new]
    #[pyo3(
        signature = (master, config, rng = None, *, grid = false, group_size = 32),
        text_signature = "(master, config, rng=None, *, grid='tensor', group_size=32)"
    )]
    fn new(
        py: Python<'_>,
        master: &Bound<'_, PyAny>,
        config: &Bound<'_, PyAny>,
        rng: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = grid_arg)] grid: bool,
        #[pyo3(from_py_with = crate::python::sizes::group_size)] group_size: usize,
    ) -> PyResult<Self> {
        let config = config_arg(config)?;
        let grid = (grid, group_size);
        let seed = match seed_arg(rng)? {
            Some(s) => s,
            None => CounterRng::from_entropy().next_u64(),
        };
        let (inner, shape) = match dtype_of(master, "master")? {
            "float64" => {
                let (o, s) = build::<f64>(py, master, config, seed, grid)?;
                (Inner::F64(o), s)
            }
            _ => {
                let (o, s) = build::<f32>(py, master, config, seed, grid)?;
                (Inner::F32(o), s)
            }
        };
        Ok(PyQatOptimizer {
            backend: Backend::Cpu(inner),
            shape,
        })
    }

    /// One AdamW step on `master` in place, then a new quantized view
    /// (`master` and `grad` are CUDA arrays on the optimizer's device when it
    /// is on one). Transactional: on error nothing changes.
    #[pyo3(signature = (master, grad, rng = None))]
    fn step(
        &mut self,
        py: Python<'_>,
        master: &Bound<'_, PyAny>,
        grad: &Bound<'_, PyAny>,
        rng: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        // A `quantrs.Rng` is advanced only by a step that succeeds.
        let generator = rng.and_then(|r| r.cast::<PyRng>().ok());
        let saved = generator.map(|g| g.borrow().inner);
        let seed = seed_arg(rng)?;
        let shape = &self.shape;
        let res = on_backend!(&mut self.backend, i => match i {
            Inner::F64(o) => step_typed(py, o, shape, master, grad, seed),
            Inner::F32(o) => step_typed(py, o, shape, master, grad, seed),
        }, c => c.step(py, master, grad, seed));
        if let (Err(_), Some(g), Some(state)) = (&res, generator, saved) {
            g.borrow_mut().inner = state;
        }
        res
    }

    /// Read-only zero-copy view of the fake-quantized weights (on a device:
    /// a `quantrs.cuda.DeviceArray` over the optimizer's buffer).
    #[getter]
    fn quantized_weights<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.try_borrow()?;
        on_backend!(&this.backend, i => match i {
            Inner::F64(o) => view(slf, o.quantized_slice(), &this.shape),
            Inner::F32(o) => view(slf, o.quantized_slice(), &this.shape),
        }, c => Ok(Bound::new(slf.py(), c.quantized_weights())?.into_any()))
    }

    /// Integer parameters in effect (None for FP8 targets).
    fn quant_params(&self) -> Option<PyQuantParams> {
        let p = on_backend!(&self.backend, i => match i {
            Inner::F64(o) => o.quant_params().copied(),
            Inner::F32(o) => o.quant_params().copied(),
        }, c => c.quant_params());
        p.map(PyQuantParams::wrap)
    }

    /// `"tensor"` or `"deploy"`.
    #[getter]
    fn grid(&self) -> &'static str {
        match self.host_grid() {
            QatGrid::PerTensor => "tensor",
            QatGrid::Deploy(_) => "deploy",
        }
    }

    /// The INT4 inputs per scale of a deploy grid (None per tensor).
    #[getter]
    fn group_size(&self) -> Option<usize> {
        match self.host_grid() {
            QatGrid::PerTensor => None,
            QatGrid::Deploy(g) => Some(g.group_size),
        }
    }

    /// Steps taken.
    fn step_count(&self) -> u64 {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => o.step_count(),
            Inner::F32(o) => o.step_count(),
        }, c => c.step_count())
    }

    /// The configuration.
    #[getter]
    fn config(&self) -> PyQatConfig {
        PyQatConfig { inner: self.cfg() }
    }

    /// The master dtype (`"float64"` or `"float32"`).
    #[getter]
    fn dtype(&self) -> &'static str {
        on_backend!(&self.backend, i => match i {
            Inner::F64(_) => f64::DTYPE,
            Inner::F32(_) => f32::DTYPE,
        }, c => c.dtype_name())
    }

    /// The master's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// Seed of the stochastic-rounding streams.
    #[getter]
    fn seed(&self) -> u64 {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => o.seed(),
            Inner::F32(o) => o.seed(),
        }, c => c.seed())
    }

    /// Where the state lives: `"cpu"` or `"cuda:N"`.
    #[getter]
    fn device(&self) -> String {
        self.device_of().name()
    }

    /// Move the moments and the view to `device` ("cpu", "cuda", "cuda:N")
    /// in place, as `torch.nn.Module.to` does, and return this optimizer.
    /// On a device, masters and gradients are CUDA arrays there.
    fn to<'py>(slf: &Bound<'py, Self>, device: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let device = crate::python::gpu::parse_device(device)?;
        slf.try_borrow_mut()?.move_to(slf.py(), device)?;
        Ok(slf.clone())
    }

    /// Copies of the AdamW moments `(m, v)` (NumPy, or `DeviceArray`s on a
    /// device).
    fn moments<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let shape = &self.shape;
        on_backend!(&self.backend, i => Ok(match i {
            Inner::F64(o) => {
                let (m, v) = o.moments();
                (
                    to_array(py, m.to_vec(), shape)?.into_any(),
                    to_array(py, v.to_vec(), shape)?.into_any(),
                )
            }
            Inner::F32(o) => {
                let (m, v) = o.moments();
                (
                    to_array(py, m.to_vec(), shape)?.into_any(),
                    to_array(py, v.to_vec(), shape)?.into_any(),
                )
            }
        }), c => {
            let (m, v) = c.moments(py)?;
            Ok((Bound::new(py, m)?.into_any(), Bound::new(py, v)?.into_any()))
        })
    }

    /// Bytes of the state: moments and view (on a device, with the step's
    /// scratch).
    fn memory_usage(&self) -> usize {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => 3 * o.len() * std::mem::size_of::<f64>(),
            Inner::F32(o) => 3 * o.len() * std::mem::size_of::<f32>(),
        }, c => c.memory_usage())
    }

    /// The whole state as bytes (versioned, CRC-checked; the same bytes on
    /// every device).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Ok(PyBytes::new(py, &self.state_bytes(py)?))
    }

    /// Rebuild (on the host) from `to_bytes()` output and the master's shape.
    #[staticmethod]
    fn from_bytes(
        data: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::scalars::shape)] shape: Vec<usize>,
    ) -> PyResult<Self> {
        let inner = crate::python::scalars::with_bytes(data, "data", |data| {
            host_from_bytes(data, &shape)
        })??;
        Ok(PyQatOptimizer {
            backend: Backend::Cpu(inner),
            shape,
        })
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let this = slf.try_borrow()?;
        let ctor = slf.get_type().getattr("from_bytes")?;
        let args = (this.to_bytes(py)?, PyTuple::new(py, &this.shape)?).into_pyobject(py)?;
        PyTuple::new(py, [ctor, args.into_any()])
    }

    fn __copy__(&self, py: Python<'_>) -> PyResult<Self> {
        self.duplicate(py)
    }

    fn __deepcopy__(&self, py: Python<'_>, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        self.duplicate(py)
    }

    fn __len__(&self) -> usize {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => o.len(),
            Inner::F32(o) => o.len(),
        }, c => c.len())
    }

    fn __repr__(&self) -> String {
        let device = match self.device_of() {
            Device::Cpu => String::new(),
            d => format!(".to('{}')", d.name()),
        };
        format!(
            "QatOptimizer(master=<{} array of shape {}>, config={}, rng={}){device}  # step_count={}",
            self.dtype(),
            shape_str(&self.shape),
            class_repr(&self.cfg()),
            self.seed(),
            self.step_count()
        )
    }
}

/// A CPU optimizer from `to_bytes()` output, checked against `shape`.
fn host_from_bytes(data: &[u8], shape: &[usize]) -> PyResult<Inner> {
    let inner = match crate::qat::serde::dtype_tag(data)? {
        2 => Inner::F64(QatOptimizer::from_bytes(data)?),
        _ => Inner::F32(QatOptimizer::from_bytes(data)?),
    };
    let n = match &inner {
        Inner::F64(o) => o.len(),
        Inner::F32(o) => o.len(),
    };
    let grid = match &inner {
        Inner::F64(o) => o.grid(),
        Inner::F32(o) => o.grid(),
    };
    if let QatGrid::Deploy(g) = grid {
        if shape != [g.out_features, g.in_features] {
            return Err(QuantError::ser(format!(
                "shape {shape:?} is not the deploy grid's [{}, {}]",
                g.out_features, g.in_features
            ))
            .into());
        }
    }
    let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if count != Some(n) {
        return Err(QuantError::ser(format!(
            "shape {shape:?} does not hold the state's {n} elements"
        ))
        .into());
    }
    Ok(inner)
}

/// A shape the way Python prints a tuple: `(4,)`, `(2, 3)`.
fn shape_str(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    }
}

impl PyQatOptimizer {
    /// The grid (a device state is always per tensor).
    fn host_grid(&self) -> QatGrid {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => o.grid(),
            Inner::F32(o) => o.grid(),
        }, _c => QatGrid::PerTensor)
    }

    pub(super) fn cfg(&self) -> QatConfig {
        on_backend!(&self.backend, i => match i {
            Inner::F64(o) => *o.config(),
            Inner::F32(o) => *o.config(),
        }, c => c.config())
    }

    fn device_of(&self) -> Device {
        on_backend!(&self.backend, _i => Device::Cpu, c => Device::Cuda(c.ordinal()))
    }

    /// The state as `to_bytes()` bytes (a host copy of a device state).
    fn state_bytes(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let _ = py;
        on_backend!(&self.backend, i => Ok(match i {
            Inner::F64(o) => o.to_bytes(),
            Inner::F32(o) => o.to_bytes(),
        }), c => c.to_bytes(py))
    }

    /// Run `f` on the host state: the CPU optimizer itself, or a host copy
    /// of a device state that replaces it when `f` succeeds.
    pub(super) fn with_host<R>(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner, &[usize]) -> PyResult<R>,
    ) -> PyResult<R> {
        let _ = py;
        let shape = &self.shape;
        on_backend!(&mut self.backend, i => f(i, shape), c => {
            let mut host = host_from_bytes(&c.to_bytes(py)?, shape)?;
            let r = f(&mut host, shape)?;
            let bytes = match &host {
                Inner::F64(o) => o.to_bytes(),
                Inner::F32(o) => o.to_bytes(),
            };
            c.load_bytes(py, &bytes)?;
            Ok(r)
        })
    }

    /// A copy of this optimizer on the same device.
    fn duplicate(&self, py: Python<'_>) -> PyResult<Self> {
        let _ = py;
        let backend = on_backend!(&self.backend, i => Backend::Cpu(i.clone()), c => Backend::Cuda(
            crate::python::gpu::CudaQat::new(py, &c.to_bytes(py)?, self.shape.clone(), c.ordinal())?
        ));
        Ok(PyQatOptimizer {
            backend,
            shape: self.shape.clone(),
        })
    }

    /// Move the state to `device` (nothing happens when it is there).
    fn move_to(&mut self, py: Python<'_>, device: Device) -> PyResult<()> {
        if self.device_of() == device {
            return Ok(());
        }
        let bytes = self.state_bytes(py)?;
        self.backend = match device {
            Device::Cpu => Backend::Cpu(host_from_bytes(&bytes, &self.shape)?),
            #[cfg(feature = "gpu")]
            Device::Cuda(ordinal) => Backend::Cuda(crate::python::gpu::CudaQat::new(
                py,
                &bytes,
                self.shape.clone(),
                ordinal,
            )?),
            #[cfg(not(feature = "gpu"))]
            Device::Cuda(_) => return Err(crate::python::gpu::without_gpu()),
        };
        Ok(())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyQatOptimizer>()?;
    Ok(())
}
