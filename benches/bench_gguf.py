"""GGUF block weights (``quantrs.GgufWeight.matmul``) against quantrs INT4 g32
(``QuantizedWeight.matmul``) on the same ``[out, in]`` shape, batch 1 and 16,
alternating in one process (``paired_ms``). ``per_byte_ratio`` is the INT4 time per
weight byte over ours per weight byte: > 1 means the GGUF kernel streams its bytes
faster. Run: ``python benches/bench_gguf.py [--quick] [--json]``."""

from __future__ import annotations

import sys

import numpy as np
from _common import emit, machine_note, paired_ms, reexec_without_openblas_overrides

# type -> (weights per block, bytes per block)
TYPES = {
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
}


def gguf_weight(name: str, out: int, inf: int, rng) -> object:
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


def run(quick: bool) -> list[dict]:
    return against_int4_g32(
        lambda w, rng: {name: gguf_weight(name, *w.shape, rng) for name in TYPES}, quick
    )


def against_int4_g32(make_cases, quick: bool) -> list[dict]:
    """``make_cases(w, rng)``'s weights (a dict name -> weight of ``w``'s shape) against
    INT4 g32 of the same random float32 ``w`` ``[out, in]``, ``matmul`` at batch 1 and 16,
    paired and alternating; ``per_byte_ratio`` divides each time by its weight bytes
    first (bench_int4_asym.py uses it too)."""
    import quantrs

    rng = np.random.default_rng(0)
    out, inf = (1024, 1024) if quick else (4096, 4096)
    w = rng.standard_normal((out, inf)).astype(np.float32)
    int4 = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.T), group_size=32)
    int4_bytes = out * inf // 2 + out * inf // 32 * 4
    cases = make_cases(w, rng)
    rows = []
    for name, q in cases.items():
        for batch in (1, 16):
            x = rng.standard_normal((batch, inf)).astype(np.float32)
            base_ms, ours_ms, ratio = paired_ms(
                lambda x=x: int4.matmul(x),
                lambda q=q, x=x: q.matmul(x),
                pairs=3 if quick else 7,
                inner=5,
            )
            per_byte = (base_ms / int4_bytes) / (ours_ms / q.nbytes)
            rows.append(
                {
                    "bench": f"{name} [{out}x{inf}] batch {batch}",
                    "ours_ms": round(ours_ms, 3),
                    "baseline": "int4 g32",
                    "baseline_ms": round(base_ms, 3),
                    "ratio": round(ratio, 3),
                    "per_byte_ratio": round(per_byte, 3),
                }
            )
    return rows


if __name__ == "__main__":
    reexec_without_openblas_overrides()
    cols = ["bench", "ours_ms", "baseline", "baseline_ms", "ratio", "per_byte_ratio"]
    emit(run("--quick" in sys.argv), cols, "--json" in sys.argv)
    print(machine_note())
