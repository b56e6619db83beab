"""Patching a ``QatOptimizer.to_bytes()`` state (format version 1).

The byte form (docs/qat.md): magic ``QATO``, u32 version, u8 dtype tag, target, scheme
and rounding codes, five f64 hyper-parameters (lr, beta1, beta2, eps, weight_decay), u64
seed, step and length, a u8 flag for quantization parameters followed (when set) by an
f64 scale and three i32, then m, v and the view as raw little-endian elements, and a CRC-32
of everything before it. The torch ``QatAdamW`` changes the hyper-parameters of a live
optimizer and restores ``(step, m, v)`` from a torch state through this one module.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from .._core import SerializationError

_MAGIC = b"QATO"
_VERSION = 1
_HYPER = struct.Struct("<5d")
_HYPER_AT = 12
_STEP_AT = 12 + 40 + 8
_LEN_AT = _STEP_AT + 8
_FLAG_AT = _LEN_AT + 8


def _check(buf: bytes) -> None:
    if buf[:4] != _MAGIC or struct.unpack_from("<I", buf, 4)[0] != _VERSION or buf[8] != 1:
        raise SerializationError(
            f"QatOptimizer state: expected a float32 state of format version {_VERSION}"
        )


def _moments_at(buf: bytes) -> tuple[int, int]:
    """``(offset of m, element count)``."""
    n = struct.unpack_from("<Q", buf, _LEN_AT)[0]
    return _FLAG_AT + 1 + (20 if buf[_FLAG_AT] else 0), n


def patch(
    state: bytes,
    hyper: tuple[float, float, float, float, float] | None = None,
    step: int | None = None,
    m: np.ndarray | None = None,
    v: np.ndarray | None = None,
) -> bytes:
    """``state`` with the given fields replaced and the CRC recomputed."""
    _check(state)
    buf = bytearray(state[:-4])
    if hyper is not None:
        _HYPER.pack_into(buf, _HYPER_AT, *hyper)
    if step is not None:
        struct.pack_into("<Q", buf, _STEP_AT, int(step))
    at, n = _moments_at(buf)
    for k, x in enumerate((m, v)):
        if x is not None:
            x = np.ascontiguousarray(x, dtype="<f4").reshape(-1)
            if x.size != n:
                raise SerializationError(f"QatOptimizer state: expected {n} moments")
            buf[at + 4 * n * k : at + 4 * n * (k + 1)] = x.tobytes()
    return bytes(buf) + struct.pack("<I", zlib.crc32(buf))
