"""Zero-point weights (``quantrs.IntZpWeight.matmul``: GPTQ / AWQ checkpoints loaded
exactly; the fused ``s * (sum(q x) - z * sum(x))`` kernel) against quantrs INT4 g32
(``QuantizedWeight.matmul``) on the same ``[out, in]`` shape, batch 1 and 16,
alternating in one process (``paired_ms``): 4-bit g128 symmetric (zero points 8) and
asymmetric, 4-bit g128 act-order (a random input permutation, gathered once per call),
and 8-bit g128. ``per_byte_ratio`` is the INT4 time per weight byte over ours per weight
byte: > 1 means ours streams its bytes faster.
Run: ``python benches/bench_gptq.py [--quick] [--json]``."""

from __future__ import annotations

import sys

import numpy as np
from _common import emit, machine_note, reexec_without_openblas_overrides
from bench_gguf import against_int4_g32


def run(quick: bool) -> list[dict]:
    return against_int4_g32(zp_cases, quick)


def zp_cases(w: np.ndarray, rng) -> dict:
    """The zero-point variants of ``w``: min / max codes at group 128, then the same
    codes with symmetric zero points and with a random act-order permutation."""
    import quantrs

    out, inf = w.shape
    asym = quantrs.IntZpWeight.quantize(w, group_size=128)
    codes, scales = asym.codes(), asym.scales().astype(np.float16)

    def parts(zeros, perm=None, bits=4, q=codes):
        return quantrs.IntZpWeight.from_parts(q, scales, zeros, group_size=128, bits=bits,
                                              perm=perm)  # fmt: skip

    return {
        "int_zp 4-bit g128 sym": parts(np.full_like(asym.zeros(), 8)),
        "int_zp 4-bit g128 asym": asym,
        "int_zp 4-bit g128 act-order": parts(asym.zeros(), rng.permutation(inf)),
        "int_zp 8-bit g128": quantrs.IntZpWeight.quantize(w, group_size=128, bits=8),
    }


if __name__ == "__main__":
    reexec_without_openblas_overrides()
    cols = ["bench", "ours_ms", "baseline", "baseline_ms", "ratio", "per_byte_ratio"]
    emit(run("--quick" in sys.argv), cols, "--json" in sys.argv)
    print(machine_note())
