"""Write the state-format-1 checkpoint fixture of ``AdamW4bit``.

Run once with the extension that wrote format version 1 (double-quantized block scales
always rounded up); the files are committed, and ``tests/python/test_optim_checkpoint_v1.py``
checks that later versions still load them and continue training from them.

- ``adamw4bit_v1.safetensors``: the state after ``STEPS`` steps (``save_state``);
- ``adamw4bit_v1_params.safetensors``: the parameters at that point (``<name>``) and after
  ``MORE`` further steps taken by the version-1 code (``<name>@more``).

    python tests/data/make_adamw4bit_v1.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import quantrs

HERE = Path(__file__).parent
# W spans one double-quantization group (256 blocks of 64) and part of a second.
SHAPES = {"W": (32, 530), "b": (40,)}
STEPS, MORE = 6, 4
LR, WD = 1e-2, 0.01


def make():
    return quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(LR, 0.9, 0.999, 1e-8, WD),
        quantrs.AdvancedQuantizationConfig(),
    )


def initial_params():
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def grads(step):
    """Gradients of step ``step``: magnitudes spread over six decades, so v's block
    scales span a wide range."""
    rng = np.random.default_rng(1000 + step)
    out = {}
    for k, s in SHAPES.items():
        g = rng.standard_normal(s) * np.exp(rng.uniform(-7, 0, s))
        out[k] = g.astype(np.float32)
    return out


def train(opt, params, start, stop):
    for s in range(start, stop):
        for k, g in grads(s).items():
            opt.update(params[k], g, name=k)
        opt.step()


def main():
    opt = make()
    params = initial_params()
    train(opt, params, 0, STEPS)
    opt.save_state(HERE / "adamw4bit_v1.safetensors")
    tensors = {k: v.copy() for k, v in params.items()}
    train(opt, params, STEPS, STEPS + MORE)
    tensors.update({f"{k}@more": v for k, v in params.items()})
    save_file(tensors, str(HERE / "adamw4bit_v1_params.safetensors"))


if __name__ == "__main__":
    main()
