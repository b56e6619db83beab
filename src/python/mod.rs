//! PyO3 bindings: the `quantrs._core` extension module.
//!
//! One file per domain; each converts and validates arrays, releases the GIL
//! around the kernel (`py.detach`) and lets `?` map core errors through the
//! single conversion point in `errors.rs`.

/// `match` over a class's `Backend` (the enum of that name in scope where it
/// is used): the host arm, and the CUDA arm in `gpu` builds only. Defined
/// before the `mod` lines, so every binding module sees it.
macro_rules! on_backend {
    ($b:expr, $cpu:ident => $ce:expr, $cuda:ident => $ge:expr) => {
        match $b {
            Backend::Cpu($cpu) => $ce,
            #[cfg(feature = "gpu")]
            Backend::Cuda($cuda) => $ge,
        }
    };
}

mod arrays;
mod atomic;
mod borrowed;
#[cfg(feature = "gpu")]
mod cuda_bench;
mod errors;
mod fields;
mod fp8;
mod gguf;
mod gpu;
mod int4;
mod int4_asym;
mod int4_k;
mod int_zp;
mod linear;
mod nibble_group;
mod optim;
mod qat;
mod scalars;
mod sizes;
mod threads;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Version, cargo features and the SIMD level the kernels use.
#[pyfunction]
fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", crate::VERSION)?;
    d.set_item("features", crate::enabled_features())?;
    d.set_item("simd", crate::simd::level().name())?;
    d.set_item("simd_detected", crate::simd::detected().name())?;
    // The INT4 matvec kernel for the default group size (the VNNI kernel,
    // where the CPU has it, serves groups of 32 rows or more).
    d.set_item(
        "int4_matvec",
        crate::int4::MatvecKernel::for_weights(
            crate::simd::level(),
            crate::int4::DEFAULT_GROUP_SIZE,
        )
        .name(),
    )?;
    // Whether batched FP8 forwards run on the AMX tile unit (docs/linear.md).
    d.set_item("amx", crate::simd::Amx::new().is_some())?;
    d.set_item("threads", rayon::current_num_threads())?;
    d.set_item("cuda_available", crate::gpu::cuda_available())?;
    Ok(d)
}

/// Benchmark helper: read every byte of `buf` once on all threads (GIL
/// released) and return a checksum, so benches can measure the machine's
/// streaming read bandwidth in the same run as the kernels. Research, not
/// product: only in builds with the `bench-internals` feature.
#[cfg(feature = "bench-internals")]
#[pyfunction]
fn _read_bandwidth_probe(py: Python<'_>, buf: numpy::PyReadonlyArray1<'_, u64>) -> PyResult<u64> {
    use rayon::prelude::*;
    let s = buf.as_slice().map_err(|e| errors::invalid("buf", e))?;
    Ok(py.detach(|| {
        s.par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
            .reduce(|| 0, u64::wrapping_add)
    }))
}

/// Whether a CUDA device can be used by this build.
#[pyfunction]
fn cuda_available() -> bool {
    crate::gpu::cuda_available()
}

#[pymodule(name = "_core")]
mod core_module {
    #[cfg(feature = "bench-internals")]
    #[pymodule_export]
    use super::_read_bandwidth_probe;
    #[pymodule_export]
    use super::build_info;
    #[pymodule_export]
    use super::cuda_available;

    use pyo3::prelude::*;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", crate::VERSION)?;
        super::errors::register(m)?;
        super::int4::register(m)?;
        super::borrowed::register(m)?;
        super::fp8::register(m)?;
        super::gguf::register(m)?;
        super::int4_asym::register(m)?;
        super::int_zp::register(m)?;
        super::linear::register(m)?;
        super::optim::register(m)?;
        super::qat::register(m)?;
        super::gpu::register(m)?;
        #[cfg(feature = "gpu")]
        super::cuda_bench::register(m)?;
        super::atomic::register(m)?;
        super::int4_k::register(m)?;
        super::threads::register(m)?;
        Ok(())
    }
}
