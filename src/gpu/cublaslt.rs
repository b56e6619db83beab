//! The W8A8 `PerTensorFP8Linear` forward at batch >= 16 on the tensor cores:
//! cuBLASLt's E4M3 x E4M3 GEMM with f32 accumulation (fast accumulation
//! off) and f32 output, on sm_89 and newer.
//!
//! Row-major `y [M, N] = xq [M, K] . wq [N, K]^T` is, column-major,
//! `D [N, M] = A^T [N, K] . B [K, M]` with A = the weight codes (K x N,
//! ld K) and B = the activation codes (K x M, ld K): the "TN" layout FP8
//! GEMMs require. `alpha = s_a * s_w` (the CPU's multiplier), bias added by a
//! separate kernel. Accuracy contract: the products of two E4M3 values are
//! exact; the tensor-core accumulation order differs from the CPU's, so
//! |y - y_cpu| <= 1e-3 * sum_k |xq_k * wq_k| * alpha + 1e-5.
//!
//! cuBLASLt is loaded at run time like the driver; where it is missing, or
//! the shape does not suit it (K, N, M multiples of 16), the tiled kernel
//! runs instead. The first failure of the library itself is kept and
//! reported by `caches::fp8_gemm_path`, and the tiled kernel is used from then on.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys};

use super::context::Gpu;
use super::memory::DeviceBuffer;
use crate::error::{QuantError, Result};

/// cuBLASLt's scratch space for the chosen algorithm.
const WORKSPACE: usize = 32 << 20;

/// A cuBLASLt handle and its workspace on one device.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: DeviceBuffer,
}

// SAFETY: the handle is used only under the Gpu's mutex, with the device's
// context bound.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created by `Lt::new`, destroyed once.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn err(what: &str, e: lt::CublasError) -> QuantError {
    QuantError::Gpu(format!("cuBLASLt {what}: {e:?}"))
}

impl Lt {
    pub fn new(gpu: &std::sync::Arc<Gpu>) -> Result<Lt> {
        // SAFETY: only tries to dlopen cuBLASLt's library names.
        if !unsafe { sys::is_culib_present() } {
            super::nvrtc::preload_beside_nvrtc("libcublasLt.so");
        }
        // SAFETY: as above.
        if !unsafe { sys::is_culib_present() } {
            return Err(QuantError::Gpu(
                "cuBLASLt (libcublasLt.so) could not be loaded".into(),
            ));
        }
        gpu.bind()?;
        let handle = lt::create_handle().map_err(|e| err("create", e))?;
        let workspace = DeviceBuffer::alloc(gpu, WORKSPACE)?;
        Ok(Lt { handle, workspace })
    }
}

/// Whether the shape suits cuBLASLt's FP8 GEMM.
pub fn shape_ok(m: usize, n: usize, k: usize) -> bool {
    m.is_multiple_of(16) && n.is_multiple_of(16) && k.is_multiple_of(16)
}

struct Guard<T: Copy>(T, unsafe fn(T) -> std::result::Result<(), lt::CublasError>);

impl<T: Copy> Drop for Guard<T> {
    fn drop(&mut self) {
        // SAFETY: each guard owns one descriptor, destroyed once.
        let _ = unsafe { (self.1)(self.0) };
    }
}

fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<()> {
    // SAFETY: `v` is a value of the attribute's type, read during the call.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(|e| err("set attribute", e))
}

/// Queue `d [m, n] (f32) = alpha * (b [m, k] (E4M3) . a [n, k]^T (E4M3))`.
///
/// # Safety
/// `a` (`n * k` codes), `b` (`m * k` codes) and `d` (room for `m * n` f32,
/// not overlapping them) are device memory of the handle's (bound) context,
/// valid until the queued GEMM has run.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn fp8_gemm(
    l: &Lt,
    a: u64,
    b: u64,
    d: u64,
    alpha: f32,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    let desc = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    )
    .map_err(|e| err("matmul descriptor", e))?;
    let _desc = Guard(desc, lt::destroy_matmul_desc);
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &1i32)?; // CUBLAS_OP_T
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?; // CUBLAS_OP_N
    set_desc(desc, A::CUBLASLT_MATMUL_DESC_FAST_ACCUM, &0i8)?;
    let layout = |t, rows: usize, cols: usize, ld: usize| {
        lt::create_matrix_layout(t, rows as u64, cols as u64, ld as i64)
            .map_err(|e| err("matrix layout", e))
    };
    let la = layout(sys::cudaDataType::CUDA_R_8F_E4M3, k, n, k)?;
    let _la = Guard(la, lt::destroy_matrix_layout);
    let lb = layout(sys::cudaDataType::CUDA_R_8F_E4M3, k, m, k)?;
    let _lb = Guard(lb, lt::destroy_matrix_layout);
    let ld = layout(sys::cudaDataType::CUDA_R_32F, n, m, n)?;
    let _ld = Guard(ld, lt::destroy_matrix_layout);
    let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
    let _pref = Guard(pref, lt::destroy_matmul_pref);
    let ws = l.workspace.bytes() as u64;
    // SAFETY: a u64 for MAX_WORKSPACE_BYTES, read during the call.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )
    }
    .map_err(|e| err("preference", e))?;
    // SAFETY: all descriptors are alive (guards above); the handle is ours.
    let heur = unsafe { lt::get_matmul_algo_heuristic(l.handle, desc, la, lb, ld, ld, pref) }
        .map_err(|e| err("no algorithm for this FP8 GEMM", e))?;
    let beta = 0f32;
    // SAFETY: a, b, d are device buffers of the sizes the layouts describe
    // (this function's contract), alpha / beta host scalars (pointer mode host),
    // the workspace ours; queued on the legacy default stream.
    unsafe {
        lt::matmul(
            l.handle,
            desc,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            a as *const c_void,
            la,
            b as *const c_void,
            lb,
            d as *const c_void,
            ld,
            d as *mut c_void,
            ld,
            &heur.algo,
            l.workspace.ptr() as *mut c_void,
            l.workspace.bytes(),
            std::ptr::null_mut(),
        )
    }
    .map_err(|e| err("matmul", e))
}
