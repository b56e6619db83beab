//! `quantrs.threads(n)` / `quantrs.num_threads()`: the process-wide cap on
//! the threads the small-batch kernels run on (`crate::par`), for a loop that
//! shares the cores with another library's spinning threads.

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::par;

/// Cap the threads quantrs's batch-1 / small-batch kernels use at once (the
/// calling thread included) to `n`, or lift the cap with `None`. The cap
/// applies at once and process-wide, like `torch.set_num_threads`; used as a
/// context manager (``with quantrs.threads(1): ...``) it is restored on exit,
/// like threadpoolctl's `threadpool_limits`. `restore()` does the same
/// without a `with`.
#[pyclass(name = "threads", module = "quantrs._core")]
struct Threads {
    previous: Option<usize>,
    restored: bool,
}

#[pymethods]
impl Threads {
    #[new]
    #[pyo3(signature = (n))]
    fn new(n: Option<i64>) -> PyResult<Self> {
        let limit = match n {
            None => None,
            Some(k) if k >= 1 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            Some(k) => {
                return Err(super::errors::invalid(
                    "n",
                    format!("expected an int >= 1 or None, got {k}"),
                ))
            }
        };
        Ok(Self {
            previous: par::set_thread_limit(limit),
            restored: false,
        })
    }

    /// Put back the cap that was in force before this call (once).
    fn restore(&mut self) {
        if !self.restored {
            par::set_thread_limit(self.previous);
            self.restored = true;
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, PyTuple>) -> bool {
        self.restore();
        false
    }
}

/// The most threads quantrs's small-batch kernels use at once: the cap set
/// by `quantrs.threads`, else every CPU the process may run on.
#[pyfunction]
fn num_threads() -> usize {
    par::thread_limit()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Threads>()?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    Ok(())
}
