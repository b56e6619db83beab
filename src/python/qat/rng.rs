//! `Rng` and the `rng` argument every stochastic call accepts.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};

use crate::python::errors::wrong_type;
use crate::qat::CounterRng;

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
    /// A generator seeded with `seed` (fresh entropy when None).
    #[new]
    #[pyo3(signature = (seed = None))]
    fn new(seed: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let inner = match seed {
            None => CounterRng::from_entropy(),
            Some(s) => CounterRng::new(int_seed(s, "seed")?),
        };
        Ok(PyRng { inner })
    }

    /// The seed it was built with.
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
    fn random<'py>(
        &mut self,
        py: Python<'py>,
        #[pyo3(from_py_with = crate::python::sizes::n)] n: usize,
    ) -> PyResult<Bound<'py, PyArray1<f64>>> {
        let mut v = crate::python::sizes::alloc(n, 0.0, "n")?;
        self.inner.fill_uniform(&mut v);
        Ok(PyArray1::from_vec(py, v))
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

    fn __setstate__(&mut self, counter: &Bound<'_, PyAny>) -> PyResult<()> {
        self.inner.counter = u64_arg(counter, "counter")?;
        Ok(())
    }
}

/// A Python int as a 64-bit seed (negative values wrap, as in NumPy).
fn int_seed(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u64> {
    if !obj.is_instance_of::<PyBool>() {
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(u);
        }
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(i as u64);
        }
    }
    let what = if arg == "rng" {
        "None, an int in [-2**63, 2**64) or a quantrs.Rng"
    } else {
        "None or an int in [-2**63, 2**64)"
    };
    Err(wrong_type(arg, what, obj))
}

/// A Python int in `[0, 2**64)`, naming `arg` (a `TypeError` for another
/// type, an `InvalidArgument` outside the range).
pub(super) fn u64_arg(obj: &Bound<'_, PyAny>, arg: &str) -> PyResult<u64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(wrong_type(arg, "int", obj));
    }
    obj.extract::<u64>().map_err(|_| {
        crate::QuantError::arg(format!("{arg}: expected an int in [0, 2**64), got {obj}")).into()
    })
}

/// `rng` argument: None, an int seed, or a `quantrs.Rng` (draws once).
pub fn seed_arg(rng: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    match rng {
        None => Ok(None),
        Some(r) if r.is_none() => Ok(None),
        Some(r) => match r.cast::<PyRng>() {
            Ok(g) => Ok(Some(g.borrow_mut().inner.next_u64())),
            Err(_) => int_seed(r, "rng").map(Some),
        },
    }
}
