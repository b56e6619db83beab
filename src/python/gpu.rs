//! `quantrs.cuda`: device arrays, DLPack in and out, and `QuantizedWeight`
//! and the linear layers on a GPU (docs/gpu.md).
//!
//! Inputs to a device object may be NumPy arrays (copied in; the result
//! comes back as NumPy), `DeviceArray`s, or any CUDA DLPack producer (a
//! `torch.cuda` tensor, a CuPy array: read in place, zero-copy; the result
//! is a `DeviceArray`). Device inputs must be C-contiguous with the exact
//! dtype; they are only ever read. Every call returns when its result is
//! complete.
//!
//! The layer classes get their `to()` here (pyo3's `multiple-pymethods`);
//! `QuantizedWeight.to` and `apply_isq(device=...)` call into this file,
//! and the optimizer classes hold the device backends it exports.

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

#[cfg(not(feature = "gpu"))]
mod imp {
    use pyo3::prelude::*;

    /// `QuantizedWeight.to` in a build without the `gpu` feature.
    pub(crate) fn quantized_weight_to<'py>(
        slf: &Bound<'py, PyAny>,
        device: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        layer_to(slf, device)
    }

    /// A layer's `to` in a build without the `gpu` feature.
    pub(crate) fn layer_to<'py>(
        slf: &Bound<'py, PyAny>,
        device: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match super::parse_device(device)? {
            crate::linear::Device::Cpu => Ok(slf.clone()),
            crate::linear::Device::Cuda(_) => Err(super::without_gpu()),
        }
    }

    pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
        Ok(())
    }
}

#[cfg(feature = "gpu")]
mod array;
#[cfg(feature = "gpu")]
mod device;
#[cfg(feature = "gpu")]
mod dlpack;
#[cfg(feature = "gpu")]
mod functions;
#[cfg(feature = "gpu")]
mod input;
#[cfg(feature = "gpu")]
mod layer;
#[cfg(feature = "gpu")]
mod optim;
#[cfg(feature = "gpu")]
mod qat;
#[cfg(feature = "gpu")]
mod qat_calibrate;
#[cfg(feature = "gpu")]
mod weight;
#[cfg(feature = "gpu")]
mod imp {
    pub(crate) use super::functions::register;
    pub(crate) use super::layer::layer_to;
    pub(crate) use super::weight::quantized_weight_to;
}

pub(crate) use imp::{layer_to, quantized_weight_to, register};
// The device backends of the optimizer classes (`python/optim`, `python/qat`).
#[cfg(feature = "gpu")]
pub(crate) use optim::CudaAdam;
#[cfg(feature = "gpu")]
pub(crate) use qat::CudaQat;

use super::linear::{PyFp8Linear, PyInt4Linear, PyInt8Linear, PyUnquantLinear};

/// `layer.to(device)`: a new layer on `device` (`"cpu"` returns the layer
/// itself); the original is unchanged.
macro_rules! layer_to_method {
    ($py:ty) => {
        #[pymethods]
        impl $py {
            /// A copy of this layer on `device` ("cuda", "cuda:N"); "cpu" returns it unchanged.
            fn to<'py>(
                slf: &Bound<'py, Self>,
                device: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                layer_to(slf.as_any(), device)
            }
        }
    };
}

layer_to_method!(PyFp8Linear);
layer_to_method!(PyUnquantLinear);
layer_to_method!(PyInt8Linear);
layer_to_method!(PyInt4Linear);
