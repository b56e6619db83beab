//! Bindings of `crate::qat`: enums, `QatConfig`, `QuantParams`, `Rng`, the
//! free functions behind `quantrs.qat`, and (in `qat/optimizer.rs`)
//! `QatOptimizer`.

mod optimizer;
mod params;

use numpy::{Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::qat::{
    CounterRng, IntDtype, QatConfig, QuantScheme, QuantTarget, Rounding, RoundingMode,
};

/// Quantization target of a `QatConfig`.
#[pyclass(module = "quantrs", name = "QuantTarget", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyQuantTarget {
    #[pyo3(name = "INT8")]
    Int8,
    #[pyo3(name = "INT4")]
    Int4,
    #[pyo3(name = "FP8_E4M3")]
    Fp8E4m3,
    #[pyo3(name = "FP8_E5M2")]
    Fp8E5m2,
}

/// Integer calibration scheme.
#[pyclass(module = "quantrs", name = "QuantScheme", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyQuantScheme {
    #[pyo3(name = "SYMMETRIC")]
    Symmetric,
    #[pyo3(name = "AFFINE")]
    Affine,
}

/// Rounding onto the grid.
#[pyclass(module = "quantrs", name = "RoundingMode", eq, eq_int, frozen)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PyRoundingMode {
    #[pyo3(name = "NEAREST")]
    Nearest,
    #[pyo3(name = "STOCHASTIC")]
    Stochastic,
}

impl From<PyQuantTarget> for QuantTarget {
    fn from(t: PyQuantTarget) -> QuantTarget {
        use crate::fp8::Fp8Format;
        match t {
            PyQuantTarget::Int8 => QuantTarget::Int(IntDtype::Int8),
            PyQuantTarget::Int4 => QuantTarget::Int(IntDtype::Int4),
            PyQuantTarget::Fp8E4m3 => QuantTarget::Fp8(Fp8Format::E4M3),
            PyQuantTarget::Fp8E5m2 => QuantTarget::Fp8(Fp8Format::E5M2),
        }
    }
}

impl From<QuantTarget> for PyQuantTarget {
    fn from(t: QuantTarget) -> PyQuantTarget {
        use crate::fp8::Fp8Format;
        match t {
            QuantTarget::Int(IntDtype::Int8) => PyQuantTarget::Int8,
            QuantTarget::Int(IntDtype::Int4) => PyQuantTarget::Int4,
            QuantTarget::Fp8(Fp8Format::E4M3) => PyQuantTarget::Fp8E4m3,
            QuantTarget::Fp8(Fp8Format::E5M2) => PyQuantTarget::Fp8E5m2,
        }
    }
}

#[pymethods]
impl PyQuantTarget {
    /// The string form (`"int8"`, ...).
    #[getter]
    fn value(&self) -> &'static str {
        QuantTarget::from(*self).name()
    }
    fn __str__(&self) -> &'static str {
        self.value()
    }
}

#[pymethods]
impl PyQuantScheme {
    #[getter]
    fn value(&self) -> &'static str {
        scheme_of(*self).name()
    }
    fn __str__(&self) -> &'static str {
        self.value()
    }
}

#[pymethods]
impl PyRoundingMode {
    #[getter]
    fn value(&self) -> &'static str {
        rounding_of(*self).name()
    }
    fn __str__(&self) -> &'static str {
        self.value()
    }
}

fn scheme_of(s: PyQuantScheme) -> QuantScheme {
    match s {
        PyQuantScheme::Symmetric => QuantScheme::Symmetric,
        PyQuantScheme::Affine => QuantScheme::Affine,
    }
}

fn rounding_of(r: PyRoundingMode) -> RoundingMode {
    match r {
        PyRoundingMode::Nearest => RoundingMode::Nearest,
        PyRoundingMode::Stochastic => RoundingMode::Stochastic,
    }
}

fn not_str(arg: &str, obj: &Bound<'_, PyAny>, enum_name: &str) -> PyErr {
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    PyTypeError::new_err(format!(
        "{arg}: expected a str or quantrs.{enum_name}, got {ty}"
    ))
}

/// A target from a string or a `QuantTarget`.
pub fn target_arg(obj: &Bound<'_, PyAny>) -> PyResult<QuantTarget> {
    if let Ok(t) = obj.cast::<PyQuantTarget>().map(|b| *b.get()) {
        return Ok(t.into());
    }
    let s: String = obj
        .extract()
        .map_err(|_| not_str("target", obj, "QuantTarget"))?;
    Ok(QuantTarget::parse(&s)?)
}

pub fn scheme_arg(obj: &Bound<'_, PyAny>) -> PyResult<QuantScheme> {
    if let Ok(t) = obj.cast::<PyQuantScheme>().map(|b| *b.get()) {
        return Ok(scheme_of(t));
    }
    let s: String = obj
        .extract()
        .map_err(|_| not_str("scheme", obj, "QuantScheme"))?;
    Ok(QuantScheme::parse(&s)?)
}

pub fn rounding_arg(obj: &Bound<'_, PyAny>) -> PyResult<RoundingMode> {
    if let Ok(t) = obj.cast::<PyRoundingMode>().map(|b| *b.get()) {
        return Ok(rounding_of(t));
    }
    let s: String = obj
        .extract()
        .map_err(|_| not_str("rounding", obj, "RoundingMode"))?;
    Ok(RoundingMode::parse(&s)?)
}

/// An integer target's dtype, or an error for FP8 targets.
pub fn int_dtype(t: QuantTarget, what: &str) -> PyResult<IntDtype> {
    match t {
        QuantTarget::Int(d) => Ok(d),
        QuantTarget::Fp8(_) => Err(crate::QuantError::arg(format!(
            "target: {what} needs an integer target ('int8' or 'int4'), got {:?}",
            t.name()
        ))
        .into()),
    }
}

/// Configuration of a `QatOptimizer` (SPEC section 7).
#[pyclass(module = "quantrs", name = "QatConfig", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyQatConfig {
    pub inner: QatConfig,
}

#[pymethods]
impl PyQatConfig {
    #[new]
    #[pyo3(
        signature = (target, scheme = None, rounding = None, lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0),
        text_signature = "(target, scheme='symmetric', rounding='nearest', lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        target: &Bound<'_, PyAny>,
        scheme: Option<&Bound<'_, PyAny>>,
        rounding: Option<&Bound<'_, PyAny>>,
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    ) -> PyResult<Self> {
        let mut c = QatConfig::new(target_arg(target)?);
        if let Some(s) = scheme {
            c.scheme = scheme_arg(s)?;
        }
        if let Some(r) = rounding {
            c.rounding = rounding_arg(r)?;
        }
        (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) = (lr, beta1, beta2, eps, weight_decay);
        c.validate()?;
        Ok(PyQatConfig { inner: c })
    }

    #[getter]
    fn target(&self) -> PyQuantTarget {
        self.inner.target.into()
    }
    #[getter]
    fn scheme(&self) -> PyQuantScheme {
        match self.inner.scheme {
            QuantScheme::Symmetric => PyQuantScheme::Symmetric,
            QuantScheme::Affine => PyQuantScheme::Affine,
        }
    }
    #[getter]
    fn rounding(&self) -> PyRoundingMode {
        match self.inner.rounding {
            RoundingMode::Nearest => PyRoundingMode::Nearest,
            RoundingMode::Stochastic => PyRoundingMode::Stochastic,
        }
    }
    #[getter]
    fn lr(&self) -> f64 {
        self.inner.lr
    }
    #[getter]
    fn beta1(&self) -> f64 {
        self.inner.beta1
    }
    #[getter]
    fn beta2(&self) -> f64 {
        self.inner.beta2
    }
    #[getter]
    fn eps(&self) -> f64 {
        self.inner.eps
    }
    #[getter]
    fn weight_decay(&self) -> f64 {
        self.inner.weight_decay
    }

    fn __repr__(&self) -> String {
        config_repr(&self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let c = &slf.get().inner;
        let args = (
            c.target.name(),
            c.scheme.name(),
            c.rounding.name(),
            c.lr,
            c.beta1,
            c.beta2,
            c.eps,
            c.weight_decay,
        );
        PyTuple::new(
            py,
            [
                slf.get_type().into_any(),
                args.into_pyobject(py)?.into_any(),
            ],
        )
    }
}

pub fn config_repr(c: &QatConfig) -> String {
    format!(
        "QatConfig(target={:?}, scheme={:?}, rounding={:?}, lr={:?}, beta1={:?}, beta2={:?}, eps={:?}, weight_decay={:?})",
        c.target.name(),
        c.scheme.name(),
        c.rounding.name(),
        c.lr,
        c.beta1,
        c.beta2,
        c.eps,
        c.weight_decay
    )
    .replace('"', "'")
}

/// A seedable, picklable counter-based generator (SplitMix64 outputs).
///
/// Passing it as `rng` draws one 64-bit seed from it (advancing it); the
/// stochastic rounding of that call is then a pure function of the seed,
/// the step and the element index.
#[pyclass(module = "quantrs", name = "Rng")]
pub struct PyRng {
    pub inner: CounterRng,
}

#[pymethods]
impl PyRng {
    #[new]
    #[pyo3(signature = (seed = None))]
    fn new(seed: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let inner = match seed {
            None => CounterRng::from_entropy(),
            Some(s) => CounterRng::new(int_seed(s)?),
        };
        Ok(PyRng { inner })
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Draws made so far.
    #[getter]
    fn counter(&self) -> u64 {
        self.inner.counter
    }

    /// The next 64-bit value.
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// `n` uniforms in `[0, 1)` (one draw from the generator).
    fn random<'py>(&mut self, py: Python<'py>, n: usize) -> Bound<'py, PyArray1<f64>> {
        let mut v = vec![0.0; n];
        self.inner.fill_uniform(&mut v);
        PyArray1::from_vec(py, v)
    }

    fn __repr__(&self) -> String {
        format!("Rng(seed={})", self.inner.seed)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyRng>()
            .map(|o| o.borrow().inner == self.inner)
            .unwrap_or(false)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let py = slf.py();
        let r = slf.borrow().inner;
        PyTuple::new(
            py,
            [
                slf.get_type().into_any(),
                (r.seed,).into_pyobject(py)?.into_any(),
                r.counter.into_pyobject(py)?.into_any(),
            ],
        )
    }

    fn __setstate__(&mut self, counter: u64) {
        self.inner.counter = counter;
    }
}

/// A Python int as a 64-bit seed (negative values wrap, as in NumPy).
fn int_seed(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(u) = obj.extract::<u64>() {
        return Ok(u);
    }
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(i as u64);
    }
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    Err(PyTypeError::new_err(format!(
        "rng: expected None, an int in [-2**63, 2**64) or a quantrs.Rng, got {ty}"
    )))
}

/// `rng` argument: None, an int seed, or a `quantrs.Rng` (draws once).
pub fn seed_arg(rng: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match rng {
        None => Ok(None),
        Some(r) if r.is_none() => Ok(None),
        Some(r) => match r.cast::<PyRng>() {
            Ok(g) => Ok(Some(g.borrow_mut().inner.next_u64())),
            Err(_) => int_seed(r).map(Some),
        },
    }
}

/// Rounding for a one-off call: stochastic streams key on the seed (fresh
/// entropy when None) and step 0.
pub fn one_off_rounding(mode: RoundingMode, seed: Option<u64>) -> Rounding {
    match mode {
        RoundingMode::Nearest => Rounding::Nearest,
        RoundingMode::Stochastic => {
            let s = seed.unwrap_or_else(|| CounterRng::from_entropy().next_u64());
            Rounding::Stochastic {
                key: crate::qat::rng::stream_key(s, 0),
            }
        }
    }
}

/// A new array of `shape` owning `v` (no copy).
pub fn to_array<'py, T: Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    PyArray1::from_vec(py, v).reshape(shape)
}

/// Float input as f32 when it is float32, else as f64.
pub enum FloatIn<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    F64(PyReadonlyArrayDyn<'py, f64>),
}

pub fn float_input<'py>(obj: &Bound<'py, PyAny>, arg: &str) -> PyResult<FloatIn<'py>> {
    if obj.cast::<PyArrayDyn<f32>>().is_ok() {
        return Ok(FloatIn::F32(super::arrays::input::<f32>(obj, arg)?));
    }
    Ok(FloatIn::F64(super::arrays::input::<f64>(obj, arg)?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyQuantTarget>()?;
    m.add_class::<PyQuantScheme>()?;
    m.add_class::<PyRoundingMode>()?;
    m.add_class::<PyQatConfig>()?;
    m.add_class::<PyRng>()?;
    params::register(m)?;
    optimizer::register(m)?;
    Ok(())
}
