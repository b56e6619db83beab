//! Every CUDA kernel source compiles with NVRTC to PTX for sm_80 and sm_90,
//! and the PTX defines every kernel the source lists. Needs no GPU, only
//! NVRTC: `QUANTRS_NVRTC` if set, else the `nvidia-cuda-nvrtc` wheel in the
//! repository's `.venv` (scripts/test.sh installs it from
//! requirements-test.txt). Without either the test fails: a kernel that
//! does not compile must never pass CI unnoticed.
#![cfg(feature = "gpu")]

use std::path::{Path, PathBuf};

use quantrs::gpu::nvrtc::{self, Output, SOURCES};

/// `.venv/lib/python*/site-packages/nvidia/cu13/lib` of the repository.
fn venv_nvrtc() -> Option<PathBuf> {
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia/cu13/lib"))
        .find(|p| p.is_dir())
}

fn point_at_nvrtc() {
    if std::env::var_os("QUANTRS_NVRTC").is_none_or(|p| p.is_empty()) {
        let dir = venv_nvrtc().expect(
            "NVRTC not found: set QUANTRS_NVRTC or run scripts/test.sh (it installs \
             nvidia-cuda-nvrtc into .venv)",
        );
        // SAFETY (edition 2021: safe call): set before any thread reads it;
        // this test's only environment write.
        std::env::set_var("QUANTRS_NVRTC", dir);
    }
    nvrtc::ensure_loaded().expect("loading NVRTC");
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    point_at_nvrtc();
    let (major, minor) = nvrtc::version().expect("nvrtcVersion");
    eprintln!("NVRTC {major}.{minor}");
    for arch in ["sm_80", "sm_90"] {
        for src in SOURCES {
            let ptx = nvrtc::compile(src, arch, Output::Ptx)
                .unwrap_or_else(|e| panic!("{} for {arch}: {e}", src.name));
            let text = String::from_utf8_lossy(&ptx);
            let target = format!(".target {arch}");
            assert!(
                text.contains(&target),
                "{}: PTX for {arch} lacks {target:?}",
                src.name
            );
            if src.options.contains(&"--fmad=false") {
                // No fused multiply-add anywhere: the CPU never contracts.
                assert!(
                    !text.contains("fma.rn"),
                    "{}: PTX for {arch} contains fma despite --fmad=false",
                    src.name
                );
            }
            for k in src.kernels {
                assert!(
                    text.contains(&format!(".entry {k}(")),
                    "{}: kernel {k} missing from the PTX for {arch}",
                    src.name
                );
            }
        }
    }
}

#[test]
fn a_broken_kernel_is_reported_with_nvrtc_log() {
    point_at_nvrtc();
    let broken = nvrtc::KernelSource {
        name: "broken",
        code: "extern \"C\" __global__ void k(float* y) { y[0] = undefined_name; }",
        kernels: &["k"],
        options: &[],
    };
    let err = nvrtc::compile(&broken, "sm_90", Output::Ptx)
        .unwrap_err()
        .to_string();
    assert!(err.contains("undefined_name"), "{err}");
}

#[test]
fn without_a_device_cuda_is_unavailable_not_a_panic() {
    // On CI machines (no driver) this is the CudaNotAvailable path; on a
    // GPU machine it must simply succeed.
    match quantrs::gpu::require_cuda() {
        Ok(()) => assert!(quantrs::gpu::cuda_available()),
        Err(e) => {
            assert!(matches!(e, quantrs::QuantError::CudaNotAvailable(_)), "{e}");
            assert!(!quantrs::gpu::cuda_available());
        }
    }
}
