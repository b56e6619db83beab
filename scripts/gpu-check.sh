#!/usr/bin/env bash
# The device check (docs/gpu.md), for a machine with an NVIDIA GPU, CUDA,
# PyTorch, CuPy, NumPy and pytest, and no Rust or network: installs the
# wheel carried in dist/ (built elsewhere by scripts/build-wheel.sh), runs
# the GPU tests (`pytest -m gpu`: every kernel against the CPU path, DLPack
# round trips with torch and CuPy, the error paths, the 4-bit optimizers bit
# for bit against the CPU over 50 steps) and then
# benches/bench_gpu.py, which prints the table. Each part has its own time
# limit (the whole script stays under 8 minutes); a failing part does not
# stop the next one, and the exit status is the first failure's.
# GPU_CHECK_TEST_S / GPU_CHECK_BENCH_S shorten the limits (seconds) for a
# quick smoke run; arguments go to bench_gpu.py (e.g. --quick).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
wheel=$(ls dist/quantrs-*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ]; then
    echo "gpu-check: no dist/quantrs-*.whl (build it with scripts/build-wheel.sh)" >&2
    exit 2
fi
site=$(mktemp -d /tmp/quantrs-site.XXXXXX)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || exit 2
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" - <<'PY'
import quantrs, quantrs.cuda as cuda
print("quantrs", quantrs.__version__, "from", quantrs.__file__)
print("build:", quantrs.build_info())
print("device:", cuda.device_info(0) if cuda.is_available() else cuda.unavailable_reason())
PY

status=0
echo "== pytest -m gpu"
timeout "${GPU_CHECK_TEST_S:-240}" "$PY" -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/python \
    || { rc=$?; [ $status -eq 0 ] && status=$rc; }
echo "== pytest tests/python/test_gpu_nocuda.py (NVRTC from the installed wheels)"
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/python/test_gpu_nocuda.py \
    || { rc=$?; [ $status -eq 0 ] && status=$rc; }
echo "== benches/bench_gpu.py"
timeout "${GPU_CHECK_BENCH_S:-200}" "$PY" benches/bench_gpu.py "$@" \
    || { rc=$?; [ $status -eq 0 ] && status=$rc; }
echo "== gpu-check: exit $status"
exit $status
