"""GGUF ``Q4_0`` writer: ``QuantizedWeight`` (group 32) to a GGUF version 3 file, the
layout described in :mod:`.gguf` (written from ggml's ``docs/gguf.md``).

Codes are kept as they are (``q = code + 8``); scales are rounded to F16, which is what
``Q4_0`` stores, and the report says how much that changed them and the weight.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from ._errors import UnsupportedFormatError
from .gguf import _STRING, DEFAULT_ALIGNMENT, MAGIC, Q4_0, VERSION


def _q4_0_blocks(qw) -> tuple[np.ndarray, dict]:
    """``Q4_0`` bytes ``[out, in / 32 * 18]`` of a group-32 ``QuantizedWeight`` and the
    report of the F16 rounding of its scales."""
    in_feat, out_feat = qw.in_feat, qw.out_feat
    data = np.asarray(qw.data).reshape(-1, out_feat)
    nib = np.empty((2 * data.shape[0], out_feat), np.uint8)
    nib[0::2], nib[1::2] = data & 0x0F, data >> 4
    q = (nib[:in_feat] ^ 8).T.reshape(out_feat, in_feat // 32, 32)  # unsigned, per block
    scales = np.asarray(qw.scales, np.float32).reshape(-1, out_feat)
    with np.errstate(over="ignore"):
        d16 = scales.astype(np.float16)
    if not np.isfinite(d16).all():
        g, o = np.argwhere(~np.isfinite(d16))[0]
        raise UnsupportedFormatError(
            f"scale [{g}, {o}] = {scales[g, o]} does not fit an F16 (|s| <= 65504)"
        )
    out = np.empty((out_feat, in_feat // 32, 18), np.uint8)
    out[..., 0:2] = np.ascontiguousarray(d16.T)[..., None].view(np.uint8)
    out[..., 2:] = q[..., :16] | (q[..., 16:] << 4)
    s32 = scales.astype(np.float64)
    changed = d16.astype(np.float64) - s32
    rel = np.abs(changed) / np.where(s32 == 0, 1, np.abs(s32))
    codes = (q.astype(np.float64) - 8).reshape(out_feat, in_feat)  # [out, in]
    g = np.arange(in_feat) // 32
    before = codes * s32.T[:, g]
    diff = codes * changed.T[:, g]
    norm = float(np.sqrt(np.square(before).sum()))
    report = {
        "scales_changed": int(np.count_nonzero(changed)),
        "max_scale_rel_change": float(rel.max(initial=0)),
        "rel_err": float(np.sqrt(np.square(diff).sum())) / norm if norm else 0.0,
        "max_abs_err": float(np.abs(diff).max(initial=0)),
    }
    return out.reshape(out_feat, -1), report


def _kv_string(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return (
        struct.pack("<Q", len(k)) + k + struct.pack("<I", _STRING) + struct.pack("<Q", len(v)) + v
    )


def _kv_u32(key: str, value: int) -> bytes:
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", 4, value)


def save_gguf(path: str | os.PathLike, tensors: dict, architecture: str = "quantrs") -> list[dict]:
    """Write ``{name: QuantizedWeight}`` to a GGUF file as ``Q4_0`` tensors ``[out,
    in]`` (``ne = [in, out]``). Each weight must have group size 32 and ``in_feat`` a
    multiple of 32. Scales are rounded to F16 (what ``Q4_0`` stores); one report row
    per tensor says how much that changed them and the weight. The file is written to
    a temporary sibling and renamed: it appears complete or not at all."""
    path = Path(path)
    blocks, rows = [], []
    for name, qw in tensors.items():
        if not isinstance(name, str) or not name:
            raise UnsupportedFormatError(f"tensor name {name!r}: expected a non-empty string")
        if qw.group_size != 32 or qw.in_feat % 32:
            raise UnsupportedFormatError(
                f"tensor {name!r}: Q4_0 needs group size 32 and in_feat a multiple of 32, "
                f"got group {qw.group_size}, in_feat {qw.in_feat}"
            )
        b, rep = _q4_0_blocks(qw)
        blocks.append((name, qw, b))
        rows.append({"name": name, "shape": [qw.out_feat, qw.in_feat], "type": "Q4_0", **rep})
    kv = [
        _kv_string("general.architecture", architecture),
        _kv_u32("general.quantization_version", 2),
    ]
    head = MAGIC + struct.pack("<IQQ", VERSION, len(blocks), len(kv)) + b"".join(kv)
    offset = 0
    offsets = []
    for name, qw, b in blocks:
        offsets.append(offset)
        n = name.encode()
        head += (
            struct.pack("<Q", len(n))
            + n
            + struct.pack("<IQQIQ", 2, qw.in_feat, qw.out_feat, Q4_0, offset)
        )
        offset += -(-b.nbytes // DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT
    head += b"\0" * (-len(head) % DEFAULT_ALIGNMENT)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            for _, _, b in blocks:
                f.write(b.tobytes())
                f.write(b"\0" * (-b.nbytes % DEFAULT_ALIGNMENT))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return rows
