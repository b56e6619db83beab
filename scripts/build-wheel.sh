#!/usr/bin/env bash
# Build the release wheel (abi3: one file for every CPython >= 3.9, with the
# `gpu` feature: pyproject.toml's [tool.maturin] features) into dist/, for
# scripts/gpu-check.sh on a machine without Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/maturin ]; then
    MATURIN=.venv/bin/maturin
else
    MATURIN=maturin
fi
rm -f dist/quantrs-*.whl
"$MATURIN" build --release --quiet --out dist
ls -l dist/quantrs-*.whl
