"""Asymmetric INT4 (``quantrs.Int4AsymWeight.matmul``, the fused ``d * sum(q x) + m *
sum(x)`` kernel) against quantrs INT4 g32 (``QuantizedWeight.matmul``) on the same
``[out, in]`` shape, batch 1 and 16, alternating in one process (``paired_ms``); GGUF
``q4_1`` (the same values as ``int4_asym`` g32, decoded block by block then dotted) is
a row of its own. ``per_byte_ratio`` is the INT4 time per weight byte over ours per
weight byte: > 1 means ours streams its bytes faster. ``int4_k`` (the k-quant-style
format: 6-bit group codes under a half pair per super-block) runs on the same fused
group dot and is a row of its own. The shapes default to one ``[4096, 4096]`` from
DRAM; ``--shapes`` takes others (SmolLM2-135M's are ``576x576,1536x576,576x1536``).
Run: ``python benches/bench_int4_asym.py [--quick] [--json] [--shapes 576x576,...]``."""

from __future__ import annotations

import sys

import numpy as np
from _common import emit, machine_note, reexec_without_openblas_overrides
from bench_gguf import against_int4_g32


def run(quick: bool, shapes=None) -> list[dict]:
    return against_int4_g32(asym_cases, quick, shapes)


def asym_cases(w: np.ndarray, rng) -> dict:
    """``int4_asym`` at groups 32 / 64 / 128 of ``w``, and its g32 values as GGUF q4_1
    blocks (``{d, m, 16 bytes}``): the decode-then-dot path on the same numbers."""
    import quantrs

    out, inf = w.shape
    cases = {
        f"int4_asym g{g}": quantrs.Int4AsymWeight.quantize(w, group_size=g, method="rtn")
        for g in (32, 64, 128)
    }
    g32 = cases["int4_asym g32"]
    sc = g32.scales().astype(np.float16).view(np.uint8).reshape(out, -1, 4)
    codes = g32.codes().reshape(out, -1, 2, 16)
    nib = (codes[:, :, 0] | (codes[:, :, 1] << 4)).astype(np.uint8)
    blocks = np.concatenate([sc, nib], axis=2).reshape(out, -1)
    cases["q4_1 (decode, then dot)"] = quantrs.GgufWeight.from_bytes("q4_1", (out, inf), blocks)
    cases["int4_k"] = quantrs.Int4KWeight.quantize(w, method="rtn")
    return cases


if __name__ == "__main__":
    reexec_without_openblas_overrides()
    cols = ["bench", "ours_ms", "baseline", "baseline_ms", "ratio", "per_byte_ratio"]
    args = sys.argv[1:]
    shapes = None
    if "--shapes" in args:  # e.g. 576x576,4096x4096 ([out]x[in])
        spec = args[args.index("--shapes") + 1].split(",")
        shapes = [tuple(int(v) for v in s.split("x")) for s in spec]
    emit(run("--quick" in args, shapes), cols, "--json" in args)
    print(machine_note())
