#!/usr/bin/env bash
# Every test of the project, from a fresh clone: Rust lint + tests, one
# release build of the extension, then the Python suite (twice: the SIMD
# kernels, then QUANTRS_SIMD=scalar over the kernel tests).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q -r requirements-test.txt

echo "== cargo fmt / clippy"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo clippy --all-targets --features python -- -D warnings
cargo clippy --all-targets --features python,gpu -- -D warnings

echo "== cargo test (with the gpu feature: tests/gpu_nvrtc.rs compiles every kernel with the venv's NVRTC)"
cargo test --all-targets --features gpu
cargo test --doc
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps

echo "== examples (docs/rust.md)"
cargo run --release --example int4_matvec
cargo run --release --example fp8_linear
cargo run --release --example adamw4bit_train
cargo run --release --example qat_loop

echo "== build the extension (release) and install it into .venv"
maturin develop --release --quiet

echo "== stubtest (python/quantrs/_core.pyi against the built module)"
python -m mypy.stubtest quantrs._core --allowlist tests/stubtest_allowlist.txt

echo "== ruff"
ruff check python tests benches
ruff format --check python tests benches

echo "== pytest"
python -m pytest -q -p no:cacheprovider
echo "== pytest, scalar kernels (QUANTRS_SIMD=scalar)"
QUANTRS_SIMD=scalar python -m pytest -q -p no:cacheprovider -m kernel
