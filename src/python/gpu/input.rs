//! Call inputs on the device: NumPy (copied in), `DeviceArray`, or a CUDA
//! DLPack producer (read in place), checked for dtype, device and layout;
//! and the result's way back (NumPy for host inputs).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::array::{describe_dl, upload, DType, DeviceArray};
use super::dlpack::{self, DL_CUDA};
use crate::error::QuantError;
use crate::gpu::context::Gpu;
use crate::gpu::memory::{DeviceElem, DeviceSlice, DeviceSliceMut};
use crate::python::errors::{invalid, wrong_dtype};

/// A call input on the device: its address, shape, and what keeps it alive.
pub struct DevInput<'py> {
    pub ptr: u64,
    pub shape: Vec<usize>,
    gpu: Arc<Gpu>,
    dtype: DType,
    /// Whether it came from the host (then the result goes back as NumPy).
    pub from_host: bool,
    _keep: Keep<'py>,
}

enum Keep<'py> {
    Array(#[allow(dead_code)] Bound<'py, DeviceArray>),
    Uploaded(#[allow(dead_code)] DeviceArray),
    Imported(#[allow(dead_code)] dlpack::Imported<'py>),
}

fn cuda_dlpack_device(obj: &Bound<'_, PyAny>) -> PyResult<Option<(i32, i32)>> {
    if !obj.hasattr("__dlpack_device__")? || !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let (t, id): (i32, i32) = obj.call_method0("__dlpack_device__")?.extract()?;
    Ok(Some((t, id)))
}

/// `obj` as a device input of `dtype` for a call on `gpu`: a `DeviceArray`
/// or CUDA DLPack tensor (must be on `gpu`, C-contiguous, of `dtype`), or
/// a host array (copied in).
pub fn device_input<'py>(
    gpu: &Arc<Gpu>,
    obj: &Bound<'py, PyAny>,
    arg: &str,
    dtype: DType,
    what: &str,
) -> PyResult<DevInput<'py>> {
    let mismatch = |on: String| {
        QuantError::arg(format!(
            "{arg} is on {on} but {what} is on cuda:{}: move one of them (.to(...))",
            gpu.ordinal
        ))
    };
    if let Ok(a) = obj.cast::<DeviceArray>() {
        let d = a.get();
        if d.dtype != dtype {
            return Err(wrong_dtype(arg, dtype.name(), d.dtype.name()));
        }
        if d.buf.gpu().ordinal != gpu.ordinal {
            return Err(mismatch(format!("cuda:{}", d.buf.gpu().ordinal)).into());
        }
        return Ok(DevInput {
            gpu: gpu.clone(),
            dtype,
            ptr: d.buf.ptr(),
            shape: d.shape.clone(),
            from_host: false,
            _keep: Keep::Array(a.clone()),
        });
    }
    if let Some((t, id)) = cuda_dlpack_device(obj)? {
        if t == DL_CUDA {
            if id as usize != gpu.ordinal {
                return Err(mismatch(format!("cuda:{id}")).into());
            }
            // stream=1: the legacy default stream, where quantrs runs; the
            // producer orders its pending work before it.
            let kwargs = PyDict::new(obj.py());
            kwargs.set_item("stream", 1)?;
            let cap = obj.call_method("__dlpack__", (), Some(&kwargs))?;
            let imp = dlpack::import(cap)?;
            if imp.device_id != gpu.ordinal as i32 {
                return Err(mismatch(format!("DLPack device {}", imp.device_id)).into());
            }
            match DType::from_dl(imp.dtype) {
                Some(d) if d == dtype => {}
                _ => return Err(wrong_dtype(arg, dtype.name(), describe_dl(imp.dtype))),
            }
            if !imp.contiguous {
                return Err(invalid(arg, format!("expected a C-contiguous tensor, got strides that are not (shape {:?}); call .contiguous() first", imp.shape)));
            }
            return Ok(DevInput {
                gpu: gpu.clone(),
                dtype,
                ptr: imp.ptr,
                shape: imp.shape.clone(),
                from_host: false,
                _keep: Keep::Imported(imp),
            });
        }
        if t != dlpack::DL_CPU {
            return Err(mismatch(format!("DLPack device type {t}")).into());
        }
    }
    let up = upload(gpu, obj, dtype, arg)?;
    Ok(DevInput {
        gpu: gpu.clone(),
        dtype,
        ptr: up.buf.ptr(),
        shape: up.shape.clone(),
        from_host: true,
        _keep: Keep::Uploaded(up),
    })
}

/// Element types of a `DType`.
pub trait HasDType: DeviceElem {
    const DTYPE: DType;
}

impl HasDType for f32 {
    const DTYPE: DType = DType::F32;
}

impl HasDType for f64 {
    const DTYPE: DType = DType::F64;
}

impl HasDType for u8 {
    const DTYPE: DType = DType::U8;
}

impl DevInput<'_> {
    fn check<T: HasDType>(&self) -> crate::Result<usize> {
        if T::DTYPE != self.dtype {
            return Err(QuantError::arg(format!(
                "a {} input read as {}",
                self.dtype.name(),
                T::DTYPE.name()
            )));
        }
        Ok(self.shape.iter().product())
    }

    /// The input as a typed view.
    pub fn view<T: HasDType>(&self) -> crate::Result<DeviceSlice<'_, T>> {
        let n = self.check::<T>()?;
        // SAFETY: `device_input` checked the dtype (`T`'s, above), the
        // device and C-contiguity; `_keep` (a DeviceArray, an uploaded copy
        // or the producer's DLPack capsule) keeps the `n` elements alive
        // while `self` is borrowed, and the glue synchronises before the
        // call returns, so no queued kernel outlives them.
        Ok(unsafe { DeviceSlice::from_raw(&self.gpu, self.ptr, n) })
    }

    /// The input as a writable view (an array the call updates in place).
    pub fn view_mut<T: HasDType>(&mut self) -> crate::Result<DeviceSliceMut<'_, T>> {
        let n = self.check::<T>()?;
        // SAFETY: as for `view`; `&mut self` makes this the only view of
        // the input, and the glue checks it does not overlap the others.
        Ok(unsafe { DeviceSliceMut::from_raw(&self.gpu, self.ptr, n) })
    }
}

/// A result: NumPy when the input came from the host, else the array.
pub fn output(py: Python<'_>, out: DeviceArray, to_host: bool) -> PyResult<Py<PyAny>> {
    if to_host {
        Ok(out.host_copy(py)?.unbind())
    } else {
        Ok(Py::new(py, out)?.into_any())
    }
}

/// Whether `obj` is a CUDA array (DeviceArray or a CUDA DLPack producer).
pub fn is_cuda_array(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    if obj.cast::<DeviceArray>().is_ok() {
        return Ok(true);
    }
    Ok(matches!(cuda_dlpack_device(obj)?, Some((DL_CUDA, _))))
}

/// The device ordinal of a CUDA array input.
pub fn cuda_ordinal(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(a) = obj.cast::<DeviceArray>() {
        return Ok(a.get().buf.gpu().ordinal);
    }
    match cuda_dlpack_device(obj)? {
        Some((DL_CUDA, id)) => Ok(id.max(0) as usize),
        _ => Err(invalid("x", "expected a CUDA array")),
    }
}
