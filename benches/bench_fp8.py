"""FP8 benchmarks: codecs against ml_dtypes, PerTensorFP8Linear.forward against NumPy.

    python benches/bench_fp8.py [--repeats 7] [--warm]

- encode / decode of 2^24 values: quantrs.fp8 vs ml_dtypes casts (fresh output
  arrays on both sides).
- forward of a 4096x4096 layer at batch 1, 16, 128: NumPy float32 ``x @ W.T`` vs
  ``PerTensorFP8Linear.forward`` weight-only (W8A32) and with a static
  activation scale (W8A8). By default every timed call starts with the weights
  evicted from cache (a 256 MiB buffer is rewritten first), so batch 1 measures
  weights streamed from DRAM; ``--warm`` skips that.

Medians of ``--repeats`` runs; after every NumPy BLAS call the script sleeps
0.25 s before timing quantrs (OpenBLAS keeps a spinning thread for ~0.1 s).
Ratios are NumPy (or ml_dtypes) time / quantrs time: > 1 means quantrs is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ml_dtypes
import numpy as np

import quantrs
from quantrs import PerTensorFP8Linear, fp8

_SCRATCH = None


def evict():
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = np.ones(1 << 25, dtype=np.float64)  # 256 MiB
    _SCRATCH += 1.0


def timeit(fn, repeats, cold=False, after_blas=False):
    times = []
    for _ in range(repeats):
        if cold:
            evict()
        if after_blas:
            time.sleep(0.25)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def row(name, base_ms, ours_ms, base_name):
    ratio = base_ms / ours_ms
    print(f"| {name:<38} | {base_ms:9.2f} | {ours_ms:9.2f} | {ratio:6.2f}x | {base_name} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warm", action="store_true", help="do not evict the weights from cache")
    ap.add_argument("--only", choices=["codecs", "forward"], help="run one half")
    args = ap.parse_args()
    r = args.repeats
    info = quantrs.build_info()
    print(
        f"quantrs {info['version']} simd={info['simd']} threads={info['threads']} "
        f"cpus={os.cpu_count()} numpy {np.__version__} ml_dtypes {ml_dtypes.__version__} "
        f"load={os.getloadavg()[0]:.1f}"
    )
    print("| operation | baseline ms | quantrs ms | speedup | baseline |")
    print("|---|---|---|---|---|")

    rng = np.random.default_rng(0)
    if args.only != "forward":
        codecs(rng, r)
    if args.only != "codecs":
        forward(rng, r, cold=not args.warm)


def codecs(rng, r):
    n = 1 << 24
    x = (rng.standard_normal(n) * 50).astype(np.float32)
    for fmt, dt in [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]:
        base = timeit(lambda dt=dt: x.astype(dt), r)
        ours = timeit(lambda fmt=fmt: fp8.encode(x, fmt), r)
        row(f"encode 2^24 f32 -> {fmt}", base, ours, "ml_dtypes astype")
        codes = fp8.encode(x, fmt)
        f8 = codes.view(dt)
        base = timeit(lambda f8=f8: f8.astype(np.float32), r)
        ours = timeit(lambda codes=codes, fmt=fmt: fp8.decode(codes, fmt), r)
        row(f"decode 2^24 {fmt} -> f32", base, ours, "ml_dtypes astype")
    base = timeit(lambda: x.astype(ml_dtypes.float8_e4m3fn), r)
    ours = timeit(lambda: fp8.encode(x, "e4m3", saturate=True), r)
    row("encode 2^24 e4m3 saturating", base, ours, "ml_dtypes astype")


def forward(rng, r, cold):
    k = m = 4096
    w = (rng.standard_normal((m, k)) / 64).astype(np.float32)
    a32 = PerTensorFP8Linear.from_float(w)
    a8 = PerTensorFP8Linear.from_float(w, activation_scale=float(np.float32(4.0 / 448)))
    where = "DRAM" if cold else "cache"
    for batch in [1, 16, 128]:
        xb = (rng.standard_normal((batch, k))).astype(np.float32)
        if batch == 1:
            xb = xb[0]
        base = timeit(lambda xb=xb: xb @ w.T, r, cold=cold)
        ours = timeit(lambda xb=xb: a32.forward(xb), r, cold=cold, after_blas=True)
        row(f"forward 4096x4096 b={batch} W8A32 ({where})", base, ours, "NumPy f32 x @ W.T")
        ours = timeit(lambda xb=xb: a8.forward(xb), r, cold=cold, after_blas=True)
        row(f"forward 4096x4096 b={batch} W8A8 ({where})", base, ours, "NumPy f32 x @ W.T")


if __name__ == "__main__":
    main()
