"""Write tests/data/int4_cases.safetensors from the NumPy reference.

The Rust test `tests/int4_cross.rs` checks `QuantizedWeight` against these
vectors bit for bit, and `tests/python/test_int4.py` checks the file is what
the reference produces today, so the two languages cannot drift apart.

    python tests/data/make_int4_cases.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from quantrs.reference import _fake_quantize_int4, pack_int4, quantize_int4

CASES = [  # (in_feat, out_feat, group_size, seed)
    (2, 3, 32, 0),
    (5, 4, 32, 1),
    (31, 7, 32, 2),
    (64, 33, 32, 3),
    (100, 17, 16, 4),
    (130, 9, 128, 5),
    (33, 5, 2, 6),
]


def case_weights(k: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    # Exact ties: half-integers on a column whose absmax is 7 (scale 1).
    if n > 1:
        w[:, 0] = rng.integers(-14, 15, size=k).astype(np.float32) / 2
        w[0, 0] = 7.0
    if n > 2:
        w[:, 1] = 0.0  # an all-zero column: scale clamps to 1e-8
    return w


def build() -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for i, (k, n, gs, seed) in enumerate(CASES):
        w = case_weights(k, n, seed)
        q, scales = quantize_int4(w, gs)
        tensors[f"case{i}.w"] = w
        tensors[f"case{i}.data"] = pack_int4(q)
        tensors[f"case{i}.scales"] = scales.reshape(-1)
        tensors[f"case{i}.dequant"] = _fake_quantize_int4(w, gs)
    return tensors


def metadata() -> dict[str, str]:
    return {"cases": json.dumps(CASES)}


def main() -> None:
    from safetensors.numpy import save_file

    out = Path(__file__).with_name("int4_cases.safetensors")
    save_file(build(), str(out), metadata=metadata())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
