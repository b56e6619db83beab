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
    fn new(n: &Bound<'_, PyAny>) -> PyResult<Self> {
        let limit = if n.is_none() {
            None
        } else {
            let k = super::sizes::int_in(n, "n", 1, i64::MAX)?;
            Some(usize::try_from(k).unwrap_or(usize::MAX))
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
    m.add_function(wrap_pyfunction!(_bandwidth_probe, m)?)?;
    Ok(())
}

/// Benchmark probe (`benches/_bandwidth.py`): stream `buf` on exactly
/// `threads` OS threads, each over one contiguous slice, GIL released.
/// `kind` "read" sums the words (a few adds per 64-byte line, far below what
/// a core can issue, so the rate is the memory's); "triad" writes
/// `out = b + 3 * c` over float32 views of three equal thirds of `buf`.
/// Returns the checksum of the read (0 for triad) so the work is not elided.
/// Not a product API: the leading underscore keeps it out of `quantrs`.
#[pyfunction]
fn _bandwidth_probe(
    py: Python<'_>,
    mut buf: numpy::PyReadwriteArray1<'_, u64>,
    #[pyo3(from_py_with = super::scalars::text::kind)] kind: String,
    #[pyo3(from_py_with = super::sizes::threads)] threads: usize,
) -> PyResult<u64> {
    let s = buf
        .as_slice_mut()
        .map_err(|e| super::errors::invalid("buf", e))?;
    if threads == 0 {
        return Err(super::errors::invalid("threads", "expected >= 1, got 0"));
    }
    match kind.as_str() {
        "read" => Ok(py.detach(|| read_words(s, threads))),
        "triad" => {
            py.detach(|| triad_words(s, threads));
            Ok(0)
        }
        other => Err(super::errors::invalid(
            "kind",
            format!("expected 'read' or 'triad', got {other:?}"),
        )),
    }
}

fn read_words(s: &[u64], threads: usize) -> u64 {
    let chunk = s.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = s
            .chunks(chunk)
            .map(|c| {
                scope.spawn(move || {
                    // Four independent sums so the loop is bound by loads.
                    let mut acc = [0u64; 4];
                    let mut it = c.chunks_exact(4);
                    for w in &mut it {
                        for (a, &v) in acc.iter_mut().zip(w) {
                            *a = a.wrapping_add(v);
                        }
                    }
                    let tail = it.remainder().iter().fold(0u64, |a, &v| a.wrapping_add(v));
                    acc.iter().fold(tail, |a, &v| a.wrapping_add(v))
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|h| h.join().unwrap_or(0))
            .fold(0, u64::wrapping_add)
    })
}

fn triad_words(s: &mut [u64], threads: usize) {
    let third = s.len() / 3;
    let (out, rest) = s.split_at_mut(third);
    let (b, c) = rest.split_at(third);
    let chunk = third.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for ((o, b), c) in out
            .chunks_mut(chunk)
            .zip(b.chunks(chunk))
            .zip(c.chunks(chunk))
        {
            scope.spawn(move || {
                // Two float32 lanes per word: the same arithmetic per byte
                // as STREAM's float32 triad.
                for ((o, &b), &c) in o.iter_mut().zip(b).zip(c) {
                    let lo = f32::from_bits(b as u32) + 3.0 * f32::from_bits(c as u32);
                    let hi =
                        f32::from_bits((b >> 32) as u32) + 3.0 * f32::from_bits((c >> 32) as u32);
                    *o = u64::from(lo.to_bits()) | (u64::from(hi.to_bits()) << 32);
                }
            });
        }
    });
}
