//! `quantrs.cuda`: device arrays, DLPack in and out, and the CUDA backends
//! of the package's classes (docs/gpu.md).
//!
//! Inputs to a device object may be NumPy arrays (copied in; the result
//! comes back as NumPy), `DeviceArray`s, or any CUDA DLPack producer (a
//! `torch.cuda` tensor, a CuPy array: read in place, zero-copy; the result
//! is a `DeviceArray`). Device inputs must be C-contiguous with the exact
//! dtype; they are only ever read. Every call returns when its result is
//! complete.
//!
//! `QuantizedWeight` and the layer classes keep their host value and, after
//! `.to("cuda")`, a CUDA placement (`CudaWeight`, `CudaLayer`) their
//! forward runs on; the optimizer classes hold the device backends
//! (`CudaAdam`, `CudaQat`). This file exports them.

use pyo3::prelude::*;

use super::errors::invalid;
use crate::linear::Device;

/// `"cpu"`, `"cuda"`, `"cuda:N"` (or a `torch.device`-like object whose
/// `str()` is one of those).
pub(crate) fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<Device> {
    let s: String = match device.extract::<String>() {
        Ok(s) => s,
        Err(_) => device.str()?.to_string(),
    };
    Device::parse(&s).ok_or_else(|| {
        invalid(
            "device",
            format!("expected 'cpu', 'cuda' or 'cuda:N', got {s:?}"),
        )
    })
}

/// The error of a move to a CUDA device in a build without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
pub(crate) fn without_gpu() -> PyErr {
    match crate::gpu::require_cuda() {
        Err(e) => e.into(),
        Ok(()) => crate::error::QuantError::CudaNotAvailable(
            "quantrs was built without the `gpu` feature".into(),
        )
        .into(),
    }
}

/// Stand-ins for the CUDA placements in a build without the `gpu` feature:
/// uninhabited, so an `Option` of one is always `None` and the classes need
/// no `cfg` of their own; making one reports `CudaNotAvailable`.
#[cfg(not(feature = "gpu"))]
mod imp {
    use std::sync::Arc;

    use pyo3::prelude::*;

    use crate::int4::QuantizedWeight as Core;
    use crate::linear::QuantMethod;

    pub(crate) enum CudaWeight {}

    impl CudaWeight {
        pub(crate) fn from_cpu(_py: Python<'_>, _w: &Core, _ordinal: usize) -> PyResult<Self> {
            Err(super::without_gpu())
        }
        pub(crate) fn ordinal(&self) -> usize {
            match *self {}
        }
        pub(crate) fn run(&self, _x: &Bound<'_, PyAny>, _vector: bool) -> PyResult<Py<PyAny>> {
            match *self {}
        }
    }

    pub(crate) enum CudaLayer {}

    impl CudaLayer {
        pub(crate) fn from_layer(
            _py: Python<'_>,
            _layer: Arc<dyn QuantMethod>,
            _ordinal: usize,
        ) -> PyResult<Self> {
            Err(super::without_gpu())
        }
        pub(crate) fn ordinal(&self) -> usize {
            match *self {}
        }
        pub(crate) fn forward(&self, _x: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
            match *self {}
        }
    }

    pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
        Ok(())
    }
}

#[cfg(feature = "gpu")]
pub(crate) mod array;
#[cfg(feature = "gpu")]
mod device;
#[cfg(feature = "gpu")]
mod dlpack;
#[cfg(feature = "gpu")]
mod functions;
#[cfg(feature = "gpu")]
pub(crate) mod input;
#[cfg(feature = "gpu")]
pub(crate) mod layer;
#[cfg(feature = "gpu")]
mod optim;
#[cfg(feature = "gpu")]
mod qat;
#[cfg(feature = "gpu")]
mod qat_calibrate;
#[cfg(feature = "gpu")]
pub(crate) mod weight;
#[cfg(feature = "gpu")]
mod imp {
    pub(crate) use super::functions::register;
    pub(crate) use super::layer::CudaLayer;
    pub(crate) use super::weight::CudaWeight;
}

pub(crate) use imp::{register, CudaLayer, CudaWeight};
// The device backends of the optimizer classes (`python/optim`, `python/qat`).
#[cfg(feature = "gpu")]
pub(crate) use optim::CudaAdam;
#[cfg(feature = "gpu")]
pub(crate) use qat::CudaQat;

/// `"cpu"`, or `"cuda:N"` for a value placed on device `N`.
pub(crate) fn placement_name(ordinal: Option<usize>) -> String {
    match ordinal {
        None => Device::Cpu.name(),
        Some(i) => Device::Cuda(i).name(),
    }
}
