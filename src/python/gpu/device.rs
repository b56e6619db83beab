//! Opening a device from Python: NVRTC is looked for next to the
//! interpreter first (PyPI's CUDA wheels), then the device is opened.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::gpu::context::{self, Gpu};

/// Find NVRTC next to the interpreter once (PyPI's `nvidia-cuda-nvrtc`
/// wheel: `nvidia/cu13/lib`, or `nvidia/cuda_nvrtc/lib` of the CUDA 12
/// wheels) unless `QUANTRS_NVRTC` is already set.
fn point_at_nvrtc(py: Python<'_>) {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        if std::env::var_os("QUANTRS_NVRTC").is_some_and(|p| !p.is_empty()) {
            return;
        }
        let found = (|| -> PyResult<Option<String>> {
            let Ok(nvidia) = py.import("nvidia") else {
                return Ok(None);
            };
            // A namespace package's _NamespacePath: list() it.
            let path = nvidia.getattr("__path__")?;
            let paths: Vec<String> = py
                .import("builtins")?
                .getattr("list")?
                .call1((path,))?
                .extract()?;
            for p in paths {
                for sub in ["cu13/lib", "cuda_nvrtc/lib"] {
                    let dir = std::path::Path::new(&p).join(sub);
                    let has = std::fs::read_dir(&dir).is_ok_and(|mut d| {
                        d.any(|e| {
                            e.is_ok_and(|e| {
                                e.file_name().to_string_lossy().starts_with("libnvrtc.so")
                            })
                        })
                    });
                    if has {
                        return Ok(Some(dir.to_string_lossy().into_owned()));
                    }
                }
            }
            Ok(None)
        })();
        if let Ok(Some(dir)) = found {
            // Through os.environ, so Python sees it too.
            let _ = py
                .import("os")
                .and_then(|os| os.getattr("environ")?.set_item("QUANTRS_NVRTC", dir));
        }
    });
}

/// The device `ordinal`, opened on first use.
pub fn gpu(py: Python<'_>, ordinal: usize) -> PyResult<Arc<Gpu>> {
    point_at_nvrtc(py);
    Ok(context::device(ordinal)?)
}
