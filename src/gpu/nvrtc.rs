//! The kernel sources (`kernels/*.cu`, one file per domain, each prefixed
//! with `kernels/common.cuh`) and their compilation with NVRTC.
//!
//! NVRTC is loaded at run time. Where the library is not on the loader's
//! path, `QUANTRS_NVRTC` names it (the file, or the folder holding
//! `libnvrtc.so.*`): `quantrs.cuda` sets it to the copy that PyPI's
//! `nvidia-cuda-nvrtc` wheel installs when one is importable, and the CI
//! test (tests/gpu_nvrtc.rs) to the copy in the test venv. A library loaded
//! by path is then found by its soname when cudarc asks for `libnvrtc.so.13`.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::error::{QuantError, Result};

/// One kernel source file.
#[derive(Debug)]
pub struct KernelSource {
    /// The domain, also the module's cache key and the program's name.
    pub name: &'static str,
    /// The CUDA C++ source (`common.cuh` is prepended when compiling).
    pub code: &'static str,
    /// Every `extern "C"` kernel in the file (the CI test checks each one
    /// is in the compiled PTX).
    pub kernels: &'static [&'static str],
    /// NVRTC options beyond the architecture and `--std=c++17`.
    pub options: &'static [&'static str],
}

const COMMON: &str = include_str!("kernels/common.cuh");

/// INT4 matvec and GEMM (CPU twins in `src/int4`).
pub const INT4: KernelSource = KernelSource {
    name: "int4",
    code: include_str!("kernels/int4.cu"),
    kernels: &["int4_matvec", "int4_gemm"],
    options: &[],
};

/// FP8 codecs and activation quantization (CPU twins in `src/fp8`).
pub const FP8: KernelSource = KernelSource {
    name: "fp8",
    code: include_str!("kernels/fp8.cu"),
    kernels: &[
        "fp8_encode_kernel",
        "fp8_decode_kernel",
        "fp8_quantize_act",
        "fp8_encode_act",
    ],
    options: &[],
};

/// The linear layers' forward passes (CPU twins in `src/linear`).
pub const LINEAR: KernelSource = KernelSource {
    name: "linear",
    code: include_str!("kernels/linear.cu"),
    kernels: &[
        "linear_f32_dot",
        "linear_f32_gemm",
        "linear_i8_dot",
        "linear_i8_gemm",
        "linear_fp8_dot",
        "linear_fp8_gemm",
        "add_bias",
    ],
    options: &[],
};

/// The 4-bit Adam / AdamW step and its helpers (CPU twin in `src/optim`).
/// `--fmad=false`: no multiply-add contraction, so every operation rounds
/// as on the CPU (bit-identical results, docs/gpu.md).
pub const OPTIM: KernelSource = KernelSource {
    name: "optim",
    code: concat!(
        include_str!("kernels/optim_math.cuh"),
        include_str!("kernels/optim.cu")
    ),
    kernels: &[
        "adam4bit_step",
        "adam4bit_rank1_stats",
        "adam4bit_rank1_clamp",
        "all_finite_f32",
        "accum_add_f32",
        "accum_mean_f32",
    ],
    options: &["--fmad=false"],
};

/// The QAT step (`QatOptimizer`, float32 and float64 masters) and the
/// per-channel calibration reduction (CPU twin in `src/qat`).
/// `--fmad=false` as for [`OPTIM`]: bit-identical to the CPU step.
pub const QAT: KernelSource = KernelSource {
    name: "qat",
    code: concat!(
        include_str!("kernels/qat_math.cuh"),
        include_str!("kernels/qat.cu")
    ),
    kernels: &[
        "qat_dry_f32",
        "qat_dry_f64",
        "qat_commit_f32",
        "qat_commit_f64",
        "qat_channel_minmax_f32",
        "qat_channel_minmax_f64",
    ],
    options: &["--fmad=false"],
};

/// Every kernel source of the crate.
pub const SOURCES: [&KernelSource; 5] = [&INT4, &FP8, &LINEAR, &OPTIM, &QAT];

/// What NVRTC produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Machine code for exactly the architecture (`sm_90`): what the
    /// device loads, with no PTX JIT (so no driver-vs-NVRTC PTX version
    /// question).
    Cubin,
    /// PTX for the virtual architecture (`compute_90`): the CI check.
    Ptx,
}

/// The files of `dir` whose names start with `prefix`, sorted.
fn files_starting(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// `path` itself, or the `libnvrtc.so*` in the folder `path`.
fn library_file(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    files_starting(path, "libnvrtc.so").into_iter().next()
}

/// The folder `QUANTRS_NVRTC` points into (PyPI's CUDA wheels put NVRTC,
/// cuBLASLt and the rest in one `lib` folder).
pub fn library_dir() -> Option<PathBuf> {
    let p = PathBuf::from(std::env::var_os("QUANTRS_NVRTC").filter(|p| !p.is_empty())?);
    if p.is_dir() {
        Some(p)
    } else {
        p.parent().map(Path::to_path_buf)
    }
}

/// Load (and keep loaded) every `prefix*` library in [`library_dir`], so
/// that cudarc's load by soname finds them.
pub fn preload_beside_nvrtc(prefix: &str) {
    if let Some(dir) = library_dir() {
        for f in files_starting(&dir, prefix) {
            // SAFETY: loading a CUDA library runs only its initialisers.
            if let Ok(lib) = unsafe { libloading::Library::new(&f) } {
                std::mem::forget(lib);
            }
        }
    }
}

/// Load NVRTC once (from `QUANTRS_NVRTC` if set, else by name).
pub fn ensure_loaded() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let mut tried = String::new();
            if let Some(p) = std::env::var_os("QUANTRS_NVRTC").filter(|p| !p.is_empty()) {
                let p = PathBuf::from(p);
                match library_file(&p) {
                    Some(file) => {
                        // NVRTC opens its builtins library by name at compile
                        // time: load the one beside it first, by path.
                        if let Some(dir) = file.parent() {
                            for b in files_starting(dir, "libnvrtc-builtins.so") {
                                // SAFETY: as below.
                                if let Ok(lib) = unsafe { libloading::Library::new(&b) } {
                                    std::mem::forget(lib);
                                }
                            }
                        }
                        // SAFETY: loading NVRTC runs only its initialisers.
                        match unsafe { libloading::Library::new(&file) } {
                            // Kept loaded for the process: cudarc finds it by soname.
                            Ok(lib) => std::mem::forget(lib),
                            Err(e) => tried = format!(" ({}: {e})", file.display()),
                        }
                    }
                    None => {
                        tried = format!(" (QUANTRS_NVRTC={} holds no libnvrtc.so*)", p.display())
                    }
                }
            }
            // SAFETY: only tries to dlopen NVRTC's library names.
            if unsafe { sys::is_culib_present() } {
                Ok(())
            } else {
                Err(format!(
                    "NVRTC (libnvrtc.so) could not be loaded{tried}: install the \
                     nvidia-cuda-nvrtc wheel or set QUANTRS_NVRTC to the library"
                ))
            }
        })
        .clone()
        .map_err(QuantError::Gpu)
}

/// The full text NVRTC compiles for `source`.
pub fn full_source(source: &KernelSource) -> String {
    format!("{COMMON}\n{}", source.code)
}

fn c_text(v: Vec<c_char>) -> String {
    let bytes: Vec<u8> = v.into_iter().map(|c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// Compile `source` for `arch` (`"sm_90"`): a CUBIN for that architecture,
/// or PTX for its virtual one. A compile error carries NVRTC's log.
pub fn compile(source: &KernelSource, arch: &str, output: Output) -> Result<Vec<u8>> {
    ensure_loaded()?;
    let digits = arch
        .trim_start_matches("sm_")
        .trim_start_matches("compute_");
    let target = match output {
        Output::Cubin => format!("--gpu-architecture=sm_{digits}"),
        Output::Ptx => format!("--gpu-architecture=compute_{digits}"),
    };
    let src = CString::new(full_source(source)).expect("kernel sources have no NUL");
    let name = CString::new(format!("{}.cu", source.name)).expect("no NUL");
    let nv = |what: &str, e: result::NvrtcError| {
        QuantError::Gpu(format!(
            "NVRTC {what} ({} kernels, {arch}): {e:?}",
            source.name
        ))
    };
    let prog = result::create_program(&src, Some(&name)).map_err(|e| nv("create", e))?;
    let mut opts = vec![target, "--std=c++17".to_string()];
    opts.extend(source.options.iter().map(|o| o.to_string()));
    // SAFETY: `prog` was created above and is destroyed once, below; `src`
    // and `name` outlive it.
    let out = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let out = match compiled {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(c_text)
                    .unwrap_or_default();
                Err(QuantError::Gpu(format!(
                    "NVRTC could not compile the {} kernels for {arch} ({e:?}):\n{log}",
                    source.name
                )))
            }
            Ok(()) => match output {
                Output::Ptx => result::get_ptx(prog)
                    .map(|v| v.into_iter().map(|c| c as u8).collect())
                    .map_err(|e| nv("get PTX", e)),
                Output::Cubin => {
                    let mut size = 0usize;
                    let mut r = sys::nvrtcGetCUBINSize(prog, &mut size).result();
                    let mut buf = vec![0u8; size];
                    if r.is_ok() {
                        r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result();
                    }
                    r.map(|_| buf).map_err(|e| nv("get CUBIN", e))
                }
            },
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// NVRTC's version, `(major, minor)`.
pub fn version() -> Result<(i32, i32)> {
    ensure_loaded()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded; two valid out-pointers.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| QuantError::Gpu(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}
