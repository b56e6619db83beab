"""Between the Rust optimizer's checkpoint dict and torch's per-parameter state.

``quantrs.AdamW4bit.state_dict()`` (docs/optim.md) returns named NumPy arrays: a ``meta``
JSON document (as uint8) with the step, the quantization choices, every parameter's shape
and a CRC-32 of the other arrays; ``config`` (float32[8]: learning_rate, beta1, beta2,
epsilon, weight_decay, adaptation_rate, min_scale, max_scale); and per parameter key ``K``
the arrays ``K/m_codes``, ``K/v_codes`` and the scales. The torch optimizers keep one Rust
engine per parameter under the fixed key :data:`KEY` and expose its arrays as fixed-size
tensors, so ``meta`` (whose length grows with the step's digits) never enters a torch
state dict: it is rebuilt here from the engine's own template, with the CRC recomputed the
way the Rust side computes it (name, a zero byte, ``<dtype><shape>``, the little-endian
bytes, in name order; from format version 2 continued over the compact, key-sorted JSON of
``meta`` without its ``checksum`` field, see docs/security.md).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np

KEY = "n:w"
PREFIX = KEY + "/"
_DTYPE_NAMES = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32"}


def _checksum(arrays: dict[str, np.ndarray]) -> int:
    crc = 0
    for name in sorted(arrays):
        if name == "meta":
            continue
        a = np.ascontiguousarray(arrays[name])
        shape = "[" + ", ".join(str(d) for d in a.shape) + "]"
        crc = zlib.crc32(name.encode() + b"\0", crc)
        crc = zlib.crc32((_DTYPE_NAMES[a.dtype] + shape).encode(), crc)
        crc = zlib.crc32(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes(), crc)
    return crc


def meta_of(rust: dict[str, np.ndarray]) -> dict[str, Any]:
    """The parsed ``meta`` document of a Rust state dict."""
    return json.loads(bytes(np.asarray(rust["meta"], np.uint8)).decode())


def seal(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """``arrays`` plus a ``meta`` whose checksum covers them (and, from version 2, the
    meta document itself)."""
    out = {k: v for k, v in arrays.items() if k != "meta"}
    body = {k: v for k, v in meta.items() if k != "checksum"}
    crc = _checksum(out)
    if int(body.get("version", 1)) >= 2:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        crc = zlib.crc32(text.encode(), crc)
    meta = dict(body, checksum=crc)
    out["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8).copy()
    return out


def split(rust: dict[str, np.ndarray]) -> tuple[int, dict[str, np.ndarray]]:
    """``(step, {suffix: array})`` of the one parameter of an engine's state dict."""
    step = int(meta_of(rust)["step"])
    return step, {k[len(PREFIX) :]: v for k, v in rust.items() if k.startswith(PREFIX)}


def join(
    template: dict[str, np.ndarray],
    step: int,
    shape: tuple[int, ...],
    arrays: dict[str, np.ndarray],
    config: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """A Rust state dict for one parameter of ``shape`` at ``step``.

    ``template`` is a state dict of the engine that will load it (its format, its
    quantization choices, its ``config`` unless ``config`` is given)."""
    meta = meta_of(template)
    meta["step"] = int(step)
    meta["params"] = {KEY: [int(d) for d in shape]}
    out = {PREFIX + k: v for k, v in arrays.items()}
    out["config"] = np.asarray(template["config"] if config is None else config, np.float32)
    return seal(out, meta)
