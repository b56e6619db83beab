"""This build's ``GgufWeight.matmul(x, activations="int8")`` against another build's
extension module loaded into the same process, alternating call batches, on the same
weight bytes and ``x``; optionally ggml_mm (benches/ggml/ggml_mm.cpp) on the same cell
between the rounds. Prints the process CPU ms per call (the smallest over the rounds)
and the ratios: a before / after of a kernel change that a loaded machine moves less
than two separate processes (gguf_a8_pairs.py ``--base``).

    RAYON_NUM_THREADS=1 python benches/ggml/gguf_a8_ab.py BASE_SO CELLS [--rounds 5]
        [--ggml-mm /tmp/ggml_mm]

BASE_SO is the other build's ``_core.abi3.so`` (for example a copy of main's
``python/quantrs/_core.abi3.so``); CELLS ``type:out:in:batch`` separated by commas
(``q8_0:1536:576:4,q4_k:576:1536:1``). Both builds' outputs are checked equal (bit for
bit) before timing. Run on one thread (``RAYON_NUM_THREADS=1``); ggml_mm runs with
``GGML_MM_THREADS=1``, its q4_0 / q4_k in ``CPU_REPACK`` and every other type in
``CPU``, as gguf_a8_pairs.py."""

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import quantrs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_a8_shapes import TYPES  # noqa: E402

CPU_MS = re.compile(r"cpu ([0-9.]+) ms/call")


def load_base(path: str):
    # The module's init symbol is `PyInit__core`: the spec's name must end in `_core`.
    spec = importlib.util.spec_from_file_location("_core", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def weight_bytes(name: str, out: int, inp: int, rng) -> np.ndarray:
    elems, size, halves = TYPES[name]
    b = rng.integers(0, 256, (out, inp // elems, size), dtype=np.uint8)
    for o in halves:  # 2**-7: small finite scales
        b[..., o : o + 2] = np.full(b.shape[:2], 0x2000, "<u2")[..., None].view(np.uint8)
    return b.reshape(out, -1)


def cpu_ms_per_call(w, x, calls: int) -> float:
    c0 = time.process_time()
    for _ in range(calls):
        w.matmul(x, activations="int8")
    return (time.process_time() - c0) / calls * 1e3


def ggml_ms(ggml_mm: str, name: str, out: int, inp: int, batch: int) -> float:
    bufts = "CPU_REPACK" if name in ("q4_0", "q4_k") else "CPU"
    env = dict(os.environ, GGML_MM_THREADS="1", GGML_MM_BUFTS=bufts)
    cmd = [ggml_mm, str(inp), str(out), str(batch), name.replace("_k", "_K")]
    text = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return float(CPU_MS.findall(text)[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("base_so")
    ap.add_argument("cells")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ggml-mm", default=None)
    ap.add_argument("--window-ms", type=float, default=20.0, help="about this long per timing")
    a = ap.parse_args()
    base = load_base(a.base_so)
    cells = {}
    for cell in a.cells.split(","):
        name, out, inp, batch = cell.split(":")
        out, inp, batch = int(out), int(inp), int(batch)
        rng = np.random.default_rng(0)
        data = weight_bytes(name, out, inp, rng)
        new = quantrs.GgufWeight.from_bytes(name, (out, inp), data)
        old = base.GgufWeight.from_bytes(name, (out, inp), data)
        x = rng.standard_normal((batch, inp), dtype=np.float32)
        y_new = np.asarray(new.matmul(x, activations="int8"))
        y_old = np.asarray(old.matmul(x, activations="int8"))
        if not np.array_equal(y_new.view(np.uint32), y_old.view(np.uint32)):
            sys.exit(f"{cell}: the two builds differ")
        # About `window_ms` per timing: a rate of ~10 ns per weight byte and row
        # (32 weights), plus ~20 us per call. Short windows and many rounds let the
        # smallest find the quiet moments of a loaded machine.
        calls = max(5, int(a.window_ms * 1e5 / (out * inp * batch / 32 + 2e4)))
        cells[(name, out, inp, batch)] = (new, old, x, calls, [float("inf")] * 3)
    for _ in range(a.rounds):
        for (name, out, inp, batch), (new, old, x, calls, best) in cells.items():
            best[0] = min(best[0], cpu_ms_per_call(new, x, calls))
            best[1] = min(best[1], cpu_ms_per_call(old, x, calls))
            if a.ggml_mm:
                best[2] = min(best[2], ggml_ms(a.ggml_mm, name, out, inp, batch))
    head = "| type | shape `[out, in]` | batch | this build ms | base ms | this / base |"
    if a.ggml_mm:
        head += " ggml ms | this / ggml | base / ggml |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for (name, out, inp, batch), (*_, (n, o, g)) in cells.items():
        row = f"| {name} | {out} x {inp} | {batch} | {n:.4f} | {o:.4f} | {n / o:.2f} |"
        if a.ggml_mm:
            row += f" {g:.4f} | {n / g:.2f} | {o / g:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
