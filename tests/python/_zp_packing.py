"""GPTQ / AWQ packers and reference dequantizers written from the published packing
rules (AutoGPTQ / GPTQModel ``pack``, AutoAWQ ``gemm`` packing; docs/checkpoints.md),
independent of quantrs: synthetic checkpoints for test_gptq_exact.py and
test_awq_exact.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: field j of a word holds column 8c + ORDER[j]


def pack_along_rows(q: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ ``qweight``: word ``[r, o]`` holds rows ``per * r + j`` of ``q [in, out]`` in
    bits ``bits * j ..`` (least significant first), ``per = 32 / bits``."""
    per = 32 // bits
    words = np.zeros((q.shape[0] // per, q.shape[1]), np.uint32)
    for j in range(per):
        words |= q[j::per].astype(np.uint32) << np.uint32(bits * j)
    return words.view(np.int32)


def pack_along_cols(z: np.ndarray, bits: int, order=None) -> np.ndarray:
    """GPTQ ``qzeros`` (``order`` None) / AWQ ``qweight`` and ``qzeros``: word ``[g, c]``
    field ``j`` holds column ``per * c + order[j]``."""
    per = 32 // bits
    order = list(range(per)) if order is None else order
    words = np.zeros((z.shape[0], z.shape[1] // per), np.uint32)
    mask = (1 << bits) - 1
    for j in range(per):
        col = z[:, order[j] :: per].astype(np.int64) & mask
        words |= col.astype(np.uint32) << np.uint32(bits * j)
    return words.view(np.int32)


def every_code(shape, bits: int, rng) -> np.ndarray:
    """Codes covering every ``bits``-bit pattern in every column, shuffled."""
    n = shape[0] * shape[1]
    flat = np.arange(n) % (1 << bits)
    return rng.permutation(flat).reshape(shape).astype(np.uint8)


def scales_both_signs(shape, rng) -> np.ndarray:
    """Finite F16 scales of both signs, a subnormal, a large one and a zero included."""
    s = (rng.standard_normal(shape) * 0.02).astype(np.float16)
    flat = s.reshape(-1)
    flat[:4] = np.array([-6e-8, 3.0e4, 0.0, -0.5], np.float16)
    return s


def zeros_with_edges(shape, bits: int, rng) -> np.ndarray:
    """Zero points with 0 and the top code present."""
    z = rng.integers(0, 1 << bits, shape).astype(np.int64)
    z.reshape(-1)[:2] = [0, (1 << bits) - 1]
    return z


def desc_act_g_idx(in_feat: int, group_size: int, rng) -> np.ndarray:
    """The ``g_idx`` GPTQ's ``desc_act=True`` writes: inputs are quantized in the order
    ``perm`` (by decreasing Hessian diagonal), input ``perm[i]`` in group ``i // gs``."""
    perm = rng.permutation(in_feat)
    g_idx = np.empty(in_feat, np.int32)
    g_idx[perm] = np.arange(in_feat) // group_size
    return g_idx


def reference(q_in_out, scales, zeros, group_of) -> np.ndarray:
    """``s * (q - z)`` in float32 per element, ``[in, out]``: the GPTQ / AWQ formula."""
    s = scales.astype(np.float32)[group_of]
    z = zeros.astype(np.float32)[group_of]
    return s * (q_in_out.astype(np.float32) - z)


def fused_bound(x, scales, q_in_out, zeros, group_of, bias=None) -> np.ndarray:
    """The fused kernel's rounding bound (docs/checkpoints.md):
    ``(in + 3) eps sum_i |s| (q_i + z) |x_i|`` (plus ``|bias|``)."""
    mag = np.abs(scales.astype(np.float64)[group_of]) * (
        q_in_out.astype(np.float64) + zeros.astype(np.float64)[group_of]
    )
    b = 0 if bias is None else np.abs(bias.astype(np.float64))
    return (x.shape[-1] + 3) * np.finfo(np.float32).eps * (np.abs(x) @ mag + b)


def write_checkpoint(folder, config: dict, tensors: dict) -> str:
    """A model folder with ``config.json`` (``quantization_config``) and one shard."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"quantization_config": config}, f)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return str(folder)


def matmul_at_level(level: str, weight_file: str, x_file: str) -> np.ndarray:
    """``IntZpWeight.matmul`` run in a fresh interpreter under ``QUANTRS_SIMD=level`` on
    the weight saved with ``np.savez`` (its parts)."""
    code = (
        "import sys, numpy as np, quantrs\n"
        "p = np.load(sys.argv[1]); x = np.load(sys.argv[2])\n"
        "w = quantrs.IntZpWeight.from_parts(p['codes'], p['scales'], p['zeros'],"
        " group_size=int(p['gs']), bits=int(p['bits']),"
        " perm=p['perm'] if p['perm'].size else None)\n"
        "np.save(sys.argv[2] + '.y.npy', w.matmul(x))\n"
    )
    env = {**os.environ, "QUANTRS_SIMD": level}
    subprocess.run([sys.executable, "-c", code, weight_file, x_file], env=env, check=True)
    return np.load(x_file + ".y.npy")
