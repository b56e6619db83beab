//! The host tests' g++ build of kernel sources (`host_math.rs`,
//! `qat_host.rs`): a harness in `host_test/` compiled with
//! `-ffp-contract=off` (the twin of NVRTC's `--fmad=false`) into a shared
//! library and loaded. `Err` (the tests print it and skip) where g++ cannot
//! be run; a compile error panics, since the kernels must compile.

use std::path::PathBuf;

/// Build and load `host_test/<harness>`; `tag` names the temporary file.
pub(super) fn load(harness: &str, tag: &str) -> Result<libloading::Library, String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/gpu/host_test");
    let out = std::env::temp_dir().join(format!("quantrs-{tag}-host-{}.so", std::process::id()));
    let status = std::process::Command::new("g++")
        .args(["-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math"])
        .args(["-Wall", "-Wno-unknown-pragmas", "-fPIC", "-shared", "-o"])
        .arg(&out)
        .arg(dir.join(harness))
        .status()
        .map_err(|e| format!("g++ could not be run: {e}"))?;
    if !status.success() {
        panic!("g++ failed to compile {harness} ({status})");
    }
    // SAFETY: our own library, whose initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&out) }.map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    Ok(lib)
}
