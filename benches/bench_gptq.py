"""Zero-point weights (``quantrs.IntZpWeight.matmul``: GPTQ / AWQ checkpoints loaded
exactly; the fused ``s * (sum(q x) - z * sum(x))`` kernel) against quantrs INT4 g32
(``QuantizedWeight.matmul``) on the same ``[out, in]`` shape, batch 1 and 16,
alternating in one process (``paired_ms``): 4-bit g128 symmetric (zero points 8) and
asymmetric, 4-bit g128 act-order (a random input permutation, gathered once per call),
and 8-bit g128. ``per_byte_ratio`` is the INT4 time per weight byte over ours per weight
byte: > 1 means ours streams its bytes faster. ``--shapes``, ``--baseline-build DIR``
(against another build of quantrs) and ``--threads N`` as in ``bench_int4_asym.py``.
Run: ``python benches/bench_gptq.py [--quick] [--json] [--shapes 1536x576,...]
[--baseline-build DIR] [--threads N]``."""

from __future__ import annotations

import numpy as np
from bench_gguf import against_int4_g32
from bench_int4_asym import main


def run(quick: bool) -> list[dict]:
    return against_int4_g32(zp_cases, quick)


def zp_cases(w: np.ndarray, rng, quantrs=None) -> dict:
    """The zero-point variants of ``w``: min / max codes at group 128, then the same
    codes with symmetric zero points and with a random act-order permutation;
    ``quantrs`` the build to make them with (default: this one)."""
    if quantrs is None:
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
    main(zp_cases)
