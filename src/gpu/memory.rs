//! Device memory owned by quantrs, typed views of it, and copies between
//! host and device.
//!
//! Plain `cuMemAlloc` allocations (never managed memory), freed when the
//! last owner drops them. Kernels take device memory only as
//! [`DeviceSlice`] / [`DeviceSliceMut`]: a view with the element type, the
//! length and the lifetime of the buffer it borrows, which only a live
//! [`DeviceBuffer`] hands out (or, for memory another framework owns, the
//! `unsafe` [`DeviceSlice::from_raw`] whose caller vouches for it).
//!
//! Ordering (docs/gpu.md, "Streams"): every quantrs kernel and copy runs on
//! the legacy default stream, so work queued by one call is complete before
//! the next call's work starts. A copy to the host waits for the queued work
//! it reads; freeing a buffer waits for the queued work first (a kernel may
//! still read it); nothing else waits.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{result, sys};

use super::context::{gpu_err, Gpu};
use crate::error::{QuantError, Result};

/// Element types kernels read and write: plain data, any bit pattern valid.
pub trait DeviceElem: Copy + Default + Send + Sync + 'static + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! device_elems {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl DeviceElem for $t {}
    )*};
}
device_elems!(f32, f64, u8, i8, u32);

/// An owned device allocation of `bytes` bytes on `gpu`.
pub struct DeviceBuffer {
    gpu: Arc<Gpu>,
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
    /// Uninitialised memory (zero bytes allocate nothing: the address is 0).
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
    pub fn from_host<T: DeviceElem>(gpu: &Arc<Gpu>, host: &[T]) -> Result<DeviceBuffer> {
        let b = DeviceBuffer::alloc(gpu, std::mem::size_of_val(host))?;
        if b.bytes > 0 {
            // SAFETY: `b` holds exactly `size_of_val(host)` bytes.
            unsafe { result::memcpy_htod_sync(b.ptr, host) }
                .map_err(|e| gpu_err("copying to the device", e))?;
        }
        Ok(b)
    }

    /// The device holding the memory.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The device address (for identity and kernel arguments; reading it
    /// is safe, the kernels that use it are not).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The whole buffer as `bytes / size_of::<T>()` elements of `T`.
    pub fn view<T: DeviceElem>(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            gpu: &self.gpu,
            ptr: self.ptr,
            len: self.bytes / std::mem::size_of::<T>(),
            _t: PhantomData,
        }
    }

    /// The whole buffer as writable elements of `T`.
    pub fn view_mut<T: DeviceElem>(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut {
            gpu: &self.gpu,
            ptr: self.ptr,
            len: self.bytes / std::mem::size_of::<T>(),
            _t: PhantomData,
        }
    }

    /// A host copy of the whole buffer as elements of `T`.
    pub fn to_host<T: DeviceElem>(&self) -> Result<Vec<T>> {
        self.view::<T>().to_host()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.gpu.bind().is_ok() {
            // Queued kernels may still use the memory: wait for them first.
            let _ = self.gpu.synchronize();
            // SAFETY: `ptr` came from `malloc_sync`, is freed once, and no
            // queued work uses it any more (synchronised above). A failure
            // (a context already torn down at exit) only leaks.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A read-only view of `len` elements of `T` in device memory.
#[derive(Clone, Copy)]
pub struct DeviceSlice<'a, T> {
    gpu: &'a Arc<Gpu>,
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

/// A writable view of `len` elements of `T` in device memory.
pub struct DeviceSliceMut<'a, T> {
    gpu: &'a Arc<Gpu>,
    ptr: u64,
    len: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T> std::fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceSlice(cuda:{}, {} elements)", self.gpu.ordinal, self.len)
    }
}

impl<T> std::fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceSliceMut(cuda:{}, {} elements)", self.gpu.ordinal, self.len)
    }
}

/// The accessors both view types share.
macro_rules! view_accessors {
    () => {
        /// The device of the memory.
        pub fn gpu(&self) -> &'a Arc<Gpu> {
            self.gpu
        }

        /// The address of the first element.
        pub fn ptr(&self) -> u64 {
            self.ptr
        }

        /// Number of elements.
        pub fn len(&self) -> usize {
            self.len
        }

        /// Whether the view holds no element.
        pub fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// A host copy (waits for the queued work that writes it).
        pub fn to_host(&self) -> Result<Vec<T>> {
            copy_to_host(self.gpu, self.ptr, self.len)
        }
    };
}

fn copy_to_host<T: DeviceElem>(gpu: &Gpu, src: u64, len: usize) -> Result<Vec<T>> {
    let mut v = vec![T::default(); len];
    if len > 0 {
        gpu.bind()?;
        // SAFETY: `src` holds `len` elements of `T` on `gpu` (a view's
        // invariant); `v` has room for exactly that. The copy runs on the
        // legacy default stream after the queued work and returns when done.
        unsafe { result::memcpy_dtoh_sync(&mut v, src) }
            .map_err(|e| gpu_err("copying to the host", e))?;
    }
    Ok(v)
}

impl<'a, T: DeviceElem> DeviceSlice<'a, T> {
    /// A view of memory quantrs does not own (a DLPack tensor of another
    /// framework).
    ///
    /// # Safety
    /// `ptr` must be 0 with `len` 0, or the address of `len` initialised
    /// elements of `T` in device memory of `gpu`'s context, valid for
    /// reads until every kernel queued on it has finished (after the
    /// lifetime `'a` ends, until [`Gpu::synchronize`] or a host copy), and
    /// not written by anyone else meanwhile.
    pub unsafe fn from_raw(gpu: &'a Arc<Gpu>, ptr: u64, len: usize) -> Self {
        DeviceSlice {
            gpu,
            ptr,
            len,
            _t: PhantomData,
        }
    }

    view_accessors!();

    /// Elements `start .. start + len` (an error past the end).
    pub fn sub(&self, start: usize, len: usize) -> Result<DeviceSlice<'a, T>> {
        if start.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(QuantError::arg(format!(
                "elements {start}..{start}+{len} of a device slice of {}",
                self.len
            )));
        }
        Ok(DeviceSlice {
            gpu: self.gpu,
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _t: PhantomData,
        })
    }

}

impl<'a, T: DeviceElem> DeviceSliceMut<'a, T> {
    /// A writable view of memory quantrs does not own.
    ///
    /// # Safety
    /// As [`DeviceSlice::from_raw`], and valid for writes, with no other
    /// view or reader of the memory meanwhile.
    pub unsafe fn from_raw(gpu: &'a Arc<Gpu>, ptr: u64, len: usize) -> Self {
        DeviceSliceMut {
            gpu,
            ptr,
            len,
            _t: PhantomData,
        }
    }

    view_accessors!();

    /// A read-only view of the same memory, for as long as this one is borrowed.
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice {
            gpu: self.gpu,
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }


    /// Queue a copy of `src` (same length, same device) into this view.
    pub fn copy_from(&mut self, src: &DeviceSlice<'_, T>) -> Result<()> {
        same_device(self.gpu, src.gpu, "src")?;
        if src.len != self.len {
            return Err(QuantError::dims("src", self.len, src.len));
        }
        if self.len == 0 {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: both views hold `len` elements of `T` on the same device;
        // `&mut self` is the only view of the destination, so they do not
        // overlap. Queued on the legacy default stream.
        unsafe {
            result::memcpy_dtod_async(
                self.ptr,
                src.ptr,
                self.len * std::mem::size_of::<T>(),
                result::stream::null(),
            )
        }
        .map_err(|e| gpu_err("copying on the device", e))
    }

    /// Queue setting every byte of the view to zero.
    pub fn zero(&mut self) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.gpu.bind()?;
        // SAFETY: the view holds `len` elements of `T` (plain data, zero
        // bytes are a valid value), written only through `&mut self`.
        unsafe {
            result::memset_d8_async(
                self.ptr,
                0,
                self.len * std::mem::size_of::<T>(),
                result::stream::null(),
            )
        }
        .map_err(|e| gpu_err("zeroing device memory", e))
    }
}

/// `Ok` when `other` is `gpu`, else an error naming `arg` and both devices.
pub(crate) fn same_device(gpu: &Gpu, other: &Gpu, arg: &str) -> Result<()> {
    if gpu.ordinal != other.ordinal {
        return Err(QuantError::arg(format!(
            "{arg} is on cuda:{} but the call runs on cuda:{}",
            other.ordinal, gpu.ordinal
        )));
    }
    Ok(())
}

/// `Ok` when the view holds exactly `want` elements on `gpu`.
pub(crate) fn check_view(gpu: &Gpu, arg: &str, on: &Gpu, len: usize, want: usize) -> Result<()> {
    same_device(gpu, on, arg)?;
    if len != want {
        return Err(QuantError::dims(arg, want, len));
    }
    Ok(())
}
