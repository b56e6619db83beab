"""GGUF block weights (``quantrs.GgufWeight.matmul``: the fused per-block row dot at
batch 1, SIMD-decoded tiles at batch 16) against quantrs INT4 g32
(``QuantizedWeight.matmul``) on the same ``[out, in]`` shape, batch 1 and 16,
alternating in one process (``paired_ms``). ``per_byte_ratio`` is the INT4 time per
weight byte over ours per weight byte: > 1 means the GGUF kernel streams its bytes
faster. ``GB/s`` is the GGUF weight's bytes over its time; ``of_read_bw`` divides it
by the machine's read bandwidth on every CPU (benches/_bandwidth.py), probed next to
each shape. The shapes are SmolLM2-135M's (``[576, 576]``, ``[1536, 576]``,
``[576, 1536]``; k-quants need inputs a multiple of 256, so they run only where the
input is 1536) and one ``[4096, 4096]`` that comes from DRAM.
With ``--activations int8`` ours run ``matmul(x, activations="int8")`` (int8 blocks of
``x``, integer block dots) against the same INT4 g32 float32 baseline.
``--baseline-build DIR`` times each GGUF weight instead against the same blocks loaded by
another build of quantrs (``DIR`` a copy of a built ``python/quantrs``, e.g. main's,
loaded beside this one; float32 activations) and INT4 g32, the three alternating in this
process for ``--rounds`` rounds (9), in CPU time per call, the fastest round of each:
``ratio`` > 1 means this build is faster, ``base_per_byte`` is the other build's
per-byte ratio against the same INT4 times. ``--threads N`` sets every build's thread
count (``--threads 1`` for the kernels alone).
Run: ``python benches/bench_gguf.py [--quick] [--json] [--types q4_k,q6_k]
[--shapes 4096x4096,576x1536] [--activations int8] [--baseline-build DIR [--rounds N]]
[--threads N]``."""

from __future__ import annotations

import sys
import time

import numpy as np
from _bandwidth import Bandwidth
from _common import emit, machine_note, paired_ms, reexec_without_openblas_overrides

# type -> (weights per block, bytes per block)
TYPES = {
    "q4_k": (256, 144),
    "q6_k": (256, 210),
    "q8_0": (32, 34),
    "q5_k": (256, 176),
    "q5_0": (32, 22),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_1": (32, 24),
}
# [out, in]: attention / MLP projections of SmolLM2-135M, then one from DRAM.
SHAPES = [(576, 576), (1536, 576), (576, 1536), (4096, 4096)]
QUICK_SHAPES = [(576, 1536), (1024, 1024)]


def gguf_weight(name: str, out: int, inf: int, rng, quantrs=None) -> object:
    """Random valid blocks of ``name`` for ``[out, in]``, loaded by ``quantrs`` (the
    build to use; default this one)."""
    if quantrs is None:
        import quantrs

    elems, size = TYPES[name]
    b = rng.integers(0, 256, (out, inf // elems, size), dtype=np.uint8)
    halves = (
        [208] if name == "q6_k" else [0, 2] if name in ("q4_1", "q5_1", "q4_k", "q5_k") else [0]
    )
    for o in halves:  # small finite scales
        h = np.full(b.shape[:2], 0x2000, "<u2")
        b[..., o : o + 2] = h[..., None].view(np.uint8)
    return quantrs.GgufWeight.from_bytes(name, (out, inf), b.reshape(out, -1))


def run(quick: bool, types: list[str], shapes=None, activations="float32") -> list[dict]:
    bw = Bandwidth(np, (1 << 28) if quick else (1 << 30))

    def cases(w, rng):
        out, inf = w.shape
        return {
            name: gguf_weight(name, out, inf, rng) for name in types if inf % TYPES[name][0] == 0
        }

    shapes = shapes or (QUICK_SHAPES if quick else SHAPES)
    rows = against_int4_g32(
        cases, quick, shapes, bw, ours=lambda q, x: q.matmul(x, activations=activations)
    )
    if activations != "float32":
        for row in rows:
            row["bench"] += f" ({activations} acts)"
    return rows


def against_int4_g32(make_cases, quick: bool, shapes=None, bw=None, ours=None) -> list[dict]:
    """``make_cases(w, rng)``'s weights (a dict name -> weight of ``w``'s shape) against
    INT4 g32 of the same random float32 ``w`` ``[out, in]``, ``matmul`` at batch 1 and 16,
    paired and alternating; ``per_byte_ratio`` divides each time by its weight bytes
    first (bench_int4_asym.py uses it too). ``shapes`` (``[out, in]`` pairs) default to
    one ``[4096, 4096]`` (``[1024, 1024]`` quick); with a ``Bandwidth`` probe ``bw``,
    each row also gets its GB/s and the fraction of the read bandwidth probed for its
    shape. ``ours(q, x)`` runs a weight (default ``q.matmul(x)``)."""
    import quantrs

    ours = ours or (lambda q, x: q.matmul(x))
    rng = np.random.default_rng(0)
    if shapes is None:
        shapes = [(1024, 1024)] if quick else [(4096, 4096)]
    rows = []
    for out, inf in shapes:
        w = rng.standard_normal((out, inf)).astype(np.float32)
        int4 = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.T), group_size=32)
        int4_bytes = out * inf // 2 + out * inf // 32 * 4
        read = bw.read() if bw is not None else None
        for name, q in make_cases(w, rng).items():
            for batch in (1, 16):
                x = rng.standard_normal((batch, inf)).astype(np.float32)
                base_ms, ours_ms, ratio = paired_ms(
                    lambda int4=int4, x=x: int4.matmul(x),
                    lambda q=q, x=x: ours(q, x),
                    pairs=3 if quick else 5,
                    inner=5,
                )
                per_byte = (base_ms / int4_bytes) / (ours_ms / q.nbytes)
                row = {
                    "bench": f"{name} [{out}x{inf}] batch {batch}",
                    "ours_ms": round(ours_ms, 3),
                    "baseline": "int4 g32",
                    "baseline_ms": round(base_ms, 3),
                    "ratio": round(ratio, 3),
                    "per_byte_ratio": round(per_byte, 3),
                }
                if read is not None:
                    gbs = q.nbytes / ours_ms / 1e6
                    row["GB/s"] = round(gbs, 1)
                    row["of_read_bw"] = round(gbs / read, 2)
                rows.append(row)
    return rows


def cpu_ms(fn, calls: int) -> float:
    """Process CPU time per call of ``calls`` calls of ``fn``, in ms."""
    t = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t) / calls * 1e3


def against_build(types: list[str], base, rounds: int, shapes) -> list[dict]:
    """Each of ``types`` loaded from the same random blocks by this build and by ``base``
    (``bench_int4_asym.load_build``), with INT4 g32 of this build on the same shape:
    ``matmul`` at batch 1 and 16, the three alternating for ``rounds`` rounds, each
    timed in process CPU time per call (on a crowded host the time a thread waits is
    not the kernel's), the fastest round of each kept. ``ratio`` > 1: this build is
    faster than ``base``; ``per_byte_ratio`` / ``base_per_byte`` as in ``run``."""
    import quantrs

    rng = np.random.default_rng(0)
    rows = []
    for out, inf in shapes:
        w = rng.standard_normal((out, inf)).astype(np.float32)
        int4 = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.T), group_size=32)
        int4_bytes = out * inf // 2 + out * inf // 32 * 4
        for name in (t for t in types if inf % TYPES[t][0] == 0):
            ours = gguf_weight(name, out, inf, np.random.default_rng(1))
            theirs = gguf_weight(name, out, inf, np.random.default_rng(1), base)
            for batch in (1, 16):
                x = rng.standard_normal((batch, inf)).astype(np.float32)
                fns = [lambda q=q, x=x: q.matmul(x) for q in (ours, theirs, int4)]
                calls = max(3, int(2e7 / (out * inf * batch)))
                best = [float("inf")] * 3
                for _ in range(rounds):
                    best = [min(b, cpu_ms(f, calls)) for b, f in zip(best, fns)]
                o, b, i = best
                rows.append({
                    "bench": f"{name} [{out}x{inf}] batch {batch}",
                    "ours_ms": round(o, 4),
                    "baseline": "baseline build",
                    "baseline_ms": round(b, 4),
                    "ratio": round(b / o, 3),
                    "int4_ms": round(i, 4),
                    "per_byte_ratio": round((i / int4_bytes) / (o / ours.nbytes), 3),
                    "base_per_byte": round((i / int4_bytes) / (b / ours.nbytes), 3),
                })  # fmt: skip
    return rows


if __name__ == "__main__":
    reexec_without_openblas_overrides()
    args = sys.argv[1:]
    types = list(TYPES)
    if "--types" in args:
        types = args[args.index("--types") + 1].split(",")
    shapes = None
    if "--shapes" in args:  # e.g. 4096x4096,576x1536 ([out]x[in])
        spec = args[args.index("--shapes") + 1].split(",")
        shapes = [tuple(int(v) for v in s.split("x")) for s in spec]
    cols = ["bench", "ours_ms", "baseline", "baseline_ms", "ratio", "per_byte_ratio"]
    cols += ["GB/s", "of_read_bw"]
    act = args[args.index("--activations") + 1] if "--activations" in args else "float32"
    base = None
    if "--baseline-build" in args:
        from bench_int4_asym import load_build

        base = load_build(args[args.index("--baseline-build") + 1])
    if "--threads" in args:
        import quantrs

        for q in (quantrs, base):
            if q is not None:
                q.threads(int(args[args.index("--threads") + 1]))
    if base is None:
        rows = run("--quick" in args, types, shapes, act)
    else:
        cols = [*cols[:5], "int4_ms", "per_byte_ratio", "base_per_byte"]
        rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 9
        rows = against_build(types, base, rounds, shapes or SHAPES)
    emit(rows, cols, "--json" in args)
    print(machine_note())
