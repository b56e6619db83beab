//! One CUDA context per device (the primary context, shared with PyTorch
//! and CuPy, so their device pointers are valid here), the device's compute
//! capability, and the cache of compiled kernel modules.
//!
//! Every failure becomes `CudaNotAvailable` (no driver, no such device, an
//! unsupported architecture) or `Gpu` (a driver call failed) with the cause;
//! the driver library is probed before its first call, since cudarc panics
//! when it cannot load one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, DriverError};

use super::nvrtc::{self, KernelSource};
use crate::error::{QuantError, Result};

/// Oldest compute capability the kernels are built and tested for.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (7, 0);

/// A driver error as a `Gpu` error naming the step that failed.
pub(crate) fn gpu_err(what: &str, e: DriverError) -> QuantError {
    let name = e
        .error_name()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
        return QuantError::Gpu(format!("{what}: device memory exhausted ({name}: {text})"));
    }
    QuantError::Gpu(format!("{what}: {name}: {text}"))
}

/// A compiled module and the functions looked up in it.
struct Module {
    module: sys::CUmodule,
    functions: HashMap<&'static str, sys::CUfunction>,
}

/// A usable CUDA device (its primary context and compiled kernels), from
/// [`device`].
pub struct Gpu {
    /// The CUDA ordinal (`cuda:N`).
    pub ordinal: usize,
    /// The device's name.
    pub name: String,
    /// `(major, minor)`.
    pub compute_capability: (i32, i32),
    ctx: Arc<CudaContext>,
    modules: Mutex<HashMap<&'static str, Module>>,
}

// SAFETY: the raw module and function handles are plain driver handles,
// valid in any thread once the context is bound (`bind` does that before
// every use); the maps are behind a mutex.
unsafe impl Send for Gpu {}
// SAFETY: as above; shared access goes through the mutexes.
unsafe impl Sync for Gpu {}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu(cuda:{}, {}, sm_{}{})",
            self.ordinal, self.name, self.compute_capability.0, self.compute_capability.1
        )
    }
}

fn driver_loaded() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the driver's library names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn open(ordinal: usize) -> Result<Gpu> {
    if !driver_loaded() {
        return Err(QuantError::CudaNotAvailable(
            "the NVIDIA driver library (libcuda.so) could not be loaded".into(),
        ));
    }
    result::init().map_err(|e| {
        QuantError::CudaNotAvailable(format!("cuInit failed: {}", gpu_err("cuInit", e)))
    })?;
    let count = result::device::get_count()
        .map_err(|e| QuantError::CudaNotAvailable(gpu_err("cuDeviceGetCount", e).to_string()))?;
    if ordinal >= count.max(0) as usize {
        return Err(QuantError::CudaNotAvailable(format!(
            "cuda:{ordinal} requested, but {count} CUDA device(s) are visible"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| gpu_err("creating the CUDA context", e))?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| gpu_err("reading the compute capability", e))?;
    let name = ctx.name().unwrap_or_else(|_| "unknown".into());
    if cc < MIN_COMPUTE_CAPABILITY {
        return Err(QuantError::CudaNotAvailable(format!(
            "cuda:{ordinal} ({name}) has compute capability {}.{}; quantrs needs {}.{} or newer",
            cc.0, cc.1, MIN_COMPUTE_CAPABILITY.0, MIN_COMPUTE_CAPABILITY.1
        )));
    }
    Ok(Gpu {
        ordinal,
        name,
        compute_capability: cc,
        ctx,
        modules: Mutex::new(HashMap::new()),
    })
}

/// The device `ordinal`, opened on first use and kept for the process.
/// A failed open is not cached, so a later call reports the cause again.
pub fn device(ordinal: usize) -> Result<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let map = GPUS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = map.get(&ordinal) {
        return Ok(g.clone());
    }
    let g = Arc::new(open(ordinal)?);
    map.insert(ordinal, g.clone());
    Ok(g)
}

/// How many devices the driver sees (0 without a driver).
pub fn device_count() -> usize {
    if !driver_loaded() || result::init().is_err() {
        return 0;
    }
    result::device::get_count().map_or(0, |c| c.max(0) as usize)
}

impl Gpu {
    /// Make this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| gpu_err("binding the CUDA context", e))
    }

    /// `sm_XY` of this device.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// Total and free device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| gpu_err("cuMemGetInfo", e))?;
        Ok((total, free))
    }

    /// Wait for everything queued on the legacy default stream, where every
    /// quantrs kernel runs: needed only before another stream or framework
    /// reads what quantrs wrote (a copy to the host waits by itself).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the null stream is always valid in a bound context.
        unsafe { result::stream::synchronize(result::stream::null()) }
            .map_err(|e| gpu_err("waiting for the kernel", e))
    }

    /// The function `name` of `source`, compiling the source with NVRTC for
    /// this device on first use (once per device and source).
    pub(crate) fn function(&self, source: &KernelSource, name: &'static str) -> Result<sys::CUfunction> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        if !modules.contains_key(source.name) {
            let image = nvrtc::compile(source, &self.arch(), nvrtc::Output::Cubin)?;
            // SAFETY: `image` is a complete CUBIN from NVRTC, alive for the call.
            let module = unsafe { result::module::load_data(image.as_ptr() as *const _) }
                .map_err(|e| gpu_err(&format!("loading the {} kernels", source.name), e))?;
            modules.insert(
                source.name,
                Module {
                    module,
                    functions: HashMap::new(),
                },
            );
        }
        let m = modules.get_mut(source.name).expect("inserted above");
        if let Some(f) = m.functions.get(name) {
            return Ok(*f);
        }
        let cname = std::ffi::CString::new(name).expect("kernel names have no NUL");
        // SAFETY: `m.module` is a loaded module of this (bound) context.
        let f = unsafe { result::module::get_function(m.module, cname) }
            .map_err(|e| gpu_err(&format!("kernel {name} in {}", source.name), e))?;
        m.functions.insert(name, f);
        Ok(f)
    }
}
