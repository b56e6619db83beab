//! `quantrs._core._atomic_write` / `_AtomicFile`: the crate's atomic file
//! replacement (`src/atomic.rs`) for the Python writers of `quantrs.formats`
//! and `quantrs.cli`, so both languages write files by the same code.

use std::path::PathBuf;

use numpy::PyReadonlyArray1;
use pyo3::prelude::*;

use crate::atomic::AtomicFile;
use crate::error::QuantError;

/// Write `data` to `path` atomically (GIL released).
#[pyfunction]
fn _atomic_write(
    py: Python<'_>,
    #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
    data: &Bound<'_, PyAny>,
) -> PyResult<()> {
    crate::python::scalars::with_bytes(data, "data", |b| {
        py.detach(|| crate::atomic::write(&path, b))
    })??;
    Ok(())
}

/// A streamed atomic write: `write` appends to a temporary next to `path`,
/// `commit` renames it over `path`, `abort` (or garbage collection before a
/// commit) deletes it.
#[pyclass(name = "_AtomicFile", module = "quantrs._core")]
struct PyAtomicFile {
    inner: Option<AtomicFile>,
    tmp: PathBuf,
}

fn finished(tmp: &std::path::Path) -> PyErr {
    QuantError::InvalidState(format!(
        "{}: the atomic write was already committed or aborted",
        tmp.display()
    ))
    .into()
}

#[pymethods]
impl PyAtomicFile {
    #[new]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = crate::python::scalars::path)] path: PathBuf,
    ) -> PyResult<Self> {
        let inner = py.detach(|| AtomicFile::create(&path))?;
        let tmp = inner.temp_path().to_path_buf();
        Ok(Self {
            inner: Some(inner),
            tmp,
        })
    }

    /// The temporary file the bytes go to until `commit`.
    #[getter]
    fn tmp(&self) -> PathBuf {
        self.tmp.clone()
    }

    /// Append the bytes of a 1-D uint8 array (no copy; GIL released).
    fn write(&mut self, py: Python<'_>, data: PyReadonlyArray1<'_, u8>) -> PyResult<()> {
        let bytes = data
            .as_slice()
            .map_err(|e| super::errors::invalid("data", e))?;
        let Some(f) = self.inner.as_mut() else {
            return Err(finished(&self.tmp));
        };
        py.detach(|| f.write_all(bytes))?;
        Ok(())
    }

    /// Fsync and rename over the target (GIL released).
    fn commit(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(f) = self.inner.take() else {
            return Err(finished(&self.tmp));
        };
        py.detach(|| f.commit())?;
        Ok(())
    }

    /// Delete the temporary; nothing after `commit` or an earlier `abort`.
    fn abort(&mut self) {
        if let Some(mut f) = self.inner.take() {
            f.abort();
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_atomic_write, m)?)?;
    m.add_class::<PyAtomicFile>()?;
    Ok(())
}
