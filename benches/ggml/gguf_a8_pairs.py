"""Run ggml_mm (benches/ggml/ggml_mm.cpp, built as its header says) and
gguf_a8_shapes.py on the same cells, alternating, each on one thread, and print
the process CPU ms per call of both and their ratio (ours / ggml, < 1: ours is
faster): the table of docs/benchmarks.md, "GGUF types with int8 activations, Zen 3".

    python benches/ggml/gguf_a8_pairs.py /tmp/ggml_mm [--passes 3]
        [--types q4_0,q6_k] [--shapes 576x1536,1536x576,4096x11008] [--batches 1,4,16]
        [--base DIR]

`--base DIR` adds a column for another build of quantrs (a copy of its `python/quantrs`
package under DIR, put first on `PYTHONPATH`), run in the same rotation: before / after.

Shapes are `[out, in]`. One thread on both sides (ggml's pool spin-waits, so its
wall-clock time on a loaded machine measures the neighbours): `GGML_MM_THREADS=1`,
`RAYON_NUM_THREADS=1`. ggml's q4_0 / q4_K run in its `CPU_REPACK` buffer (the AVX2
8x8 repacked kernels, its first choice on this machine); every other type in `CPU`
(the repack buffer does not take them). Each cell keeps the smallest CPU time of
its passes."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
KQUANT = ("q4_k", "q5_k", "q6_k")
CPU_MS = re.compile(r"cpu ([0-9.]+) ms/call")


def cpu_ms(cmd: list[str], env: dict[str, str]) -> float:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return float(CPU_MS.findall(out)[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ggml_mm")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--types", default=",".join(LEGACY + KQUANT))
    ap.add_argument("--shapes", default="576x1536,1536x576,4096x11008")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--base", default=None)
    a = ap.parse_args()
    env = dict(os.environ, GGML_MM_THREADS="1", RAYON_NUM_THREADS="1")
    cells = []
    for shape in a.shapes.split(","):
        out, inp = map(int, shape.split("x"))
        for t in a.types.split(","):
            elems = 256 if t in KQUANT else 32
            if inp % elems:
                continue
            for b in map(int, a.batches.split(",")):
                cells.append((t, out, inp, b))
    best = {c: [float("inf")] * 3 for c in cells}
    benv = None
    if a.base:
        benv = dict(env, PYTHONPATH=os.pathsep.join([a.base, env.get("PYTHONPATH", "")]))
    for _ in range(a.passes):
        for c in cells:
            t, out, inp, b = c
            gt = t.replace("_k", "_K")
            genv = dict(env, GGML_MM_BUFTS="CPU_REPACK" if t in ("q4_0", "q4_k") else "CPU")
            ours = [sys.executable, str(HERE / "gguf_a8_shapes.py"), str(inp), str(out), str(b), t]
            theirs = [a.ggml_mm, str(inp), str(out), str(b), gt]
            best[c][1] = min(best[c][1], cpu_ms(theirs, genv))
            best[c][0] = min(best[c][0], cpu_ms(ours, env))
            if benv is not None:
                best[c][2] = min(best[c][2], cpu_ms(ours, benv))
    base = " base ms | base / ggml |" if benv else ""
    print(f"| type | shape `[out, in]` | batch | quantrs ms | ggml ms | ratio |{base}")
    print("|---|---|---|---|---|---|" + ("---|---|" if benv else ""))
    for (t, out, inp, b), (q, g, o) in best.items():
        row = f"| {t} | {out} x {inp} | {b} | {q:.3f} | {g:.3f} | {q / g:.2f} |"
        if benv:
            row += f" {o:.3f} | {o / g:.2f} |"
        print(row)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
