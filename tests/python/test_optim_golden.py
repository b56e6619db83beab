"""The 4-bit AdamW step's bits, pinned: a few steps of fixed inputs under each state
configuration give the weights and state bytes recorded here (state format 2, computed before
the AVX2 step was rebuilt), at the SIMD level in force, on the scalar reference
(``QUANTRS_SIMD=scalar``) and on one thread. A kernel change that moves one bit of the
weights or of the state fails here, whichever level and thread count it runs at
(docs/optim.md, "The fused step")."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import quantrs

# Groups of 256 blocks of 64 (16384 elements): three full groups, a partial one with a
# block that is not a multiple of 8 lanes.
N = 3 * 16384 + 1000 + 6
STEPS = 3

# name -> (class, weight decay, AdvancedQuantizationConfig arguments, shape)
CASES = {
    "defaults": ("AdamW4bit", 0.01, {}, (N,)),
    "adam_l2": ("Adam4bit", 0.01, {}, (N,)),
    "int8": ("AdamW4bit", 0.01, {"method": "int8"}, (N,)),
    "int4_linear": ("AdamW4bit", 0.0, {"method": "int4", "variance_map": "linear"}, (N,)),
    "dynamic_log": ("AdamW4bit", 0.01, {"method": "dynamic", "variance_map": "log"}, (N,)),
    "sqrt_linear_f32_scales": (
        "AdamW4bit",
        0.01,
        {"variance_map": "sqrt_linear", "double_quantization": False},
        (N,),
    ),
    "block_128": ("AdamW4bit", 0.01, {"block_size": 128}, (N,)),
    "rank1": ("AdamW4bit", 0.01, {"rank1_normalization": True}, (130, 301)),
}

# sha256 of the weights and of every state tensor after STEPS steps (computed at the
# commit before the AVX2 step was rebuilt; identical at every level and thread count).
GOLDEN = {
    "defaults": "ae0a1a8c4b1464f0c79c10c50911d9e8cbd855857975553cfaf35bd59efa824d",
    "adam_l2": "eec7b44295bb34558ee9131f4de9211a12fb8e666d2e3cf3b945a0255726ae89",
    "int8": "0b36d792d29fc6a4030ff3ced4c48b19933d5b8858b9c98995990d3758157bdd",
    "int4_linear": "7952ac3c93af9050503cb3d47aa7fd4f17983abe8528b86ec220b3879c09d3b7",
    "dynamic_log": "abf6d74dd6d2489646399a6c92730ebbe0db00ac66a5eee0bf9f8b2a146ad11c",
    "sqrt_linear_f32_scales": "b8eeeaa41bf53abd687014a92e3d021c178c75d47915ba94484232617016798d",
    "block_128": "dd27ac73ad0d641f6399abbfb0e440fcdc7e2788fbeef6c19f998f1617521e24",
    "rank1": "a44915444d3396d6e3665308b0a0a61e9da521c524467687e58f2638dda65c98",
}


def _values(n: int, seed: int) -> np.ndarray:
    """Deterministic values in [-0.5, 0.5) from integer arithmetic (no RNG version drift),
    with magnitudes spread over 2^-6 .. 2^6 block by block."""
    i = np.arange(n, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(seed * 40503 + 1)) % np.uint64(1 << 32)
    x = h.astype(np.float64) / float(1 << 32) - 0.5
    spread = np.exp2(((i // 64) % 13).astype(np.float64) - 6.0)
    return (x * spread).astype(np.float32)


def digests() -> dict[str, str]:
    """Each case's sha256 after STEPS steps, at this process's SIMD level and thread count."""
    out = {}
    for name, (cls, wd, q, shape) in CASES.items():
        opt = getattr(quantrs, cls).with_quantization_config(
            quantrs.Adam4bitOptimizerConfig(1e-2, 0.9, 0.999, 1e-8, wd),
            quantrs.AdvancedQuantizationConfig(
                q.get("method", "nf4"), **{k: v for k, v in q.items() if k != "method"}
            ),
        )
        n = int(np.prod(shape))
        w = _values(n, 1).reshape(shape)
        for t in range(STEPS):
            g = (_values(n, 10 + t) * np.float32(0.05)).reshape(shape)
            opt.update(w, g, name="w")
            opt.step()
        h = hashlib.sha256(w.tobytes())
        state = opt.state_dict()
        for k in sorted(state):
            if k not in ("meta", "config"):
                h.update(k.encode())
                h.update(np.ascontiguousarray(state[k]).tobytes())
        out[name] = h.hexdigest()
    return out


def _in_subprocess(env: dict[str, str]) -> dict[str, str]:
    code = f"import sys, json; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
    code += "import test_optim_golden as t; print(json.dumps(t.digests()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.kernel
def test_state_bits_match_the_golden_at_the_level_in_force():
    assert digests() == GOLDEN


@pytest.mark.kernel
@pytest.mark.parametrize(
    "env",
    [{"QUANTRS_SIMD": "scalar"}, {"RAYON_NUM_THREADS": "1"}, {"RAYON_NUM_THREADS": "3"}],
    ids=["scalar", "one_thread", "three_threads"],
)
def test_state_bits_match_the_golden_on_every_path(env):
    assert _in_subprocess(env) == GOLDEN


if __name__ == "__main__":
    print(json.dumps(digests(), indent=4))
