//! The DLPack C structures (dlpack.h, the unversioned `DLManagedTensor`
//! every framework exchanges through a `"dltensor"` capsule), producing a
//! capsule for a `DeviceArray` and reading one from a producer.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::ffi;
use pyo3::prelude::*;

use crate::gpu::memory::DeviceBuffer;

pub const CAPSULE_NAME: &CStr = c"dltensor";
pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
pub const DL_INT: u8 = 0;
pub const DL_UINT: u8 = 1;
pub const DL_FLOAT: u8 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What an exported tensor keeps alive: the buffer and the shape arrays.
struct Export {
    _buf: Arc<DeviceBuffer>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn delete_export(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its context were made by `export` with Box::into_raw
    // and the deleter runs once (DLPack's contract).
    unsafe {
        drop(Box::from_raw((*m).manager_ctx as *mut Export));
        drop(Box::from_raw(m));
    }
}

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule; a consumer that took the
    // tensor renamed the capsule ("used_dltensor") and owns it, so only an
    // unconsumed "dltensor" capsule is deleted here.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let m =
                ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        }
    }
}

/// A `"dltensor"` capsule for the C-contiguous `shape` of `dtype` in `buf`.
pub fn export<'py>(
    py: Python<'py>,
    buf: Arc<DeviceBuffer>,
    shape: &[usize],
    dtype: DLDataType,
) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let data = buf.ptr() as *mut c_void;
    let device_id = buf.gpu().ordinal as i32;
    let mut ctx = Box::new(Export {
        _buf: buf,
        shape,
        strides,
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data,
            device: DLDevice {
                device_type: DL_CUDA,
                device_id,
            },
            ndim: ctx.shape.len() as i32,
            dtype,
            shape: ctx.shape.as_mut_ptr(),
            strides: ctx.strides.as_mut_ptr(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_export),
    });
    let m = Box::into_raw(managed);
    // SAFETY: `m` is a valid, uniquely owned DLManagedTensor; its context
    // is attached before anyone else can see it.
    unsafe {
        (*m).manager_ctx = Box::into_raw(ctx) as *mut c_void;
        let cap = ffi::PyCapsule_New(
            m as *mut c_void,
            CAPSULE_NAME.as_ptr(),
            Some(capsule_destructor),
        );
        if cap.is_null() {
            delete_export(m);
        }
        Bound::from_owned_ptr_or_err(py, cap)
    }
}

/// A CUDA tensor read from a producer's capsule. The capsule (kept here)
/// owns the memory until this is dropped; the producer's deleter then runs
/// when the capsule is collected.
pub struct Imported<'py> {
    _capsule: Bound<'py, PyAny>,
    pub ptr: u64,
    pub device_id: i32,
    pub dtype: DLDataType,
    pub shape: Vec<usize>,
    /// C-contiguous (strides absent or compact; size-1 dimensions ignored).
    pub contiguous: bool,
}

/// Read the `"dltensor"` capsule a producer returned.
pub fn import<'py>(capsule: Bound<'py, PyAny>) -> PyResult<Imported<'py>> {
    // SAFETY: PyCapsule_GetPointer checks the object is a capsule with this
    // name (else it sets an exception and returns NULL); the tensor it
    // points at stays valid while the capsule lives, which `Imported` keeps.
    unsafe {
        let m = ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE_NAME.as_ptr())
            as *const DLManagedTensor;
        if m.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        let t = &(*m).dl_tensor;
        let ndim = t.ndim.max(0) as usize;
        let shape: Vec<usize> = if ndim == 0 {
            vec![]
        } else {
            std::slice::from_raw_parts(t.shape, ndim)
                .iter()
                .map(|&d| d.max(0) as usize)
                .collect()
        };
        let contiguous = if t.strides.is_null() || ndim == 0 {
            true
        } else {
            let strides = std::slice::from_raw_parts(t.strides, ndim);
            let mut expected = 1i64;
            let mut ok = true;
            for i in (0..ndim).rev() {
                if shape[i] != 1 && strides[i] != expected {
                    ok = false;
                }
                expected *= shape[i] as i64;
            }
            ok
        };
        Ok(Imported {
            ptr: t.data as u64 + t.byte_offset,
            device_id: if t.device.device_type == DL_CUDA {
                t.device.device_id
            } else {
                -1
            },
            dtype: t.dtype,
            shape,
            contiguous,
            _capsule: capsule,
        })
    }
}
