//! Device memory owned by quantrs, and copies between host and device.
//!
//! Plain `cuMemAlloc` allocations (never managed memory), freed when the
//! last owner drops them. Every copy is synchronous: when it returns the
//! data is where the caller asked.

use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{gpu_err, Gpu};
use crate::error::Result;

/// An owned device allocation of `bytes` bytes on `gpu`.
pub struct DeviceBuffer {
    pub gpu: Arc<Gpu>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer(cuda:{}, {} bytes)",
            self.gpu.ordinal, self.bytes
        )
    }
}

impl DeviceBuffer {
    /// Uninitialised memory (zero bytes allocate nothing: the pointer is 0).
    pub fn alloc(gpu: &Arc<Gpu>, bytes: usize) -> Result<DeviceBuffer> {
        gpu.bind()?;
        let ptr = if bytes == 0 {
            0
        } else {
            // SAFETY: a plain allocation in the bound context.
            unsafe { result::malloc_sync(bytes) }.map_err(|e| {
                gpu_err(
                    &format!("allocating {bytes} bytes on cuda:{}", gpu.ordinal),
                    e,
                )
            })?
        };
        Ok(DeviceBuffer {
            gpu: gpu.clone(),
            ptr,
            bytes,
        })
    }

    /// Zero-filled memory.
    pub fn zeros(gpu: &Arc<Gpu>, bytes: usize) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(gpu, bytes)?;
        if bytes > 0 {
            // SAFETY: `b` owns `bytes` bytes at `b.ptr`.
            unsafe { result::memset_d8_sync(b.ptr, 0, bytes) }
                .map_err(|e| gpu_err("zeroing device memory", e))?;
        }
        Ok(b)
    }

    /// A copy of `host` on the device.
    pub fn from_host<T: Copy>(gpu: &Arc<Gpu>, host: &[T]) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(gpu, std::mem::size_of_val(host))?;
        if b.bytes > 0 {
            // SAFETY: `b` holds exactly `size_of_val(host)` bytes.
            unsafe { result::memcpy_htod_sync(b.ptr, host) }
                .map_err(|e| gpu_err("copying to the device", e))?;
        }
        Ok(b)
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from `malloc_sync` and is freed once. A
            // failure (a context already torn down at exit) only leaks.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Copy `count` elements of `T` from device address `src` to the host.
pub fn to_host<T: Copy + Default>(gpu: &Gpu, src: u64, count: usize) -> Result<Vec<T>> {
    let mut v = vec![T::default(); count];
    if count > 0 {
        gpu.bind()?;
        // SAFETY: the caller guarantees `src` holds `count` elements of `T`
        // on `gpu`; `v` has room for exactly that.
        unsafe { result::memcpy_dtoh_sync(&mut v, src) }
            .map_err(|e| gpu_err("copying to the host", e))?;
    }
    Ok(v)
}
