"""GGUF writer: quantrs packed weights to a GGUF version 3 file, the layout described
in :mod:`.gguf` (written from ggml's ``docs/gguf.md``).

- ``QuantizedWeight`` (group 32) as ``Q4_0``: codes kept (``q = code + 8``), scales
  rounded to F16, which is what ``Q4_0`` stores; the report says how much that changed
  them and the weight.
- ``Int4AsymWeight`` (group 32) as ``Q4_1``: the same halves and codes, exactly (an
  ``int4_asym`` group of 32 is a ``Q4_1`` block, docs/int4.md).
- ``Int4KWeight`` with super-blocks of 256 inputs as ``Q4_K``: the same halves, 6-bit step
  and minimum codes and nibbles, rearranged into ggml's block (exactly: both dequantize
  ``(D * sc) * q - (Dmin * mn)`` in float32).
- ``GgufWeight`` as its own block type, its bytes unchanged.

A file of these tensors alone is no model llama.cpp loads (no metadata, vocabulary or float
tensors); ``quantrs quantize IN.gguf OUT.gguf`` writes a whole model from a GGUF model
(:mod:`.gguf_rewrite`).
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from ._errors import UnsupportedFormatError
from .gguf import _STRING, DEFAULT_ALIGNMENT, GGML_TYPES, MAGIC, VERSION
from .own_layout import pack_runs

_TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}
_EXACT = {"scales_changed": 0, "max_scale_rel_change": 0.0, "rel_err": 0.0, "max_abs_err": 0.0}


def _blocks_of(name: str, w) -> tuple[str, np.ndarray, dict]:
    """``(ggml type, bytes [out, row bytes], report)`` of one weight."""
    from .. import GgufWeight, Int4AsymWeight, Int4KWeight, QuantizedWeight

    if isinstance(w, GgufWeight):
        return w.type.upper(), np.asarray(w.to_bytes()).reshape(w.shape[0], -1), dict(_EXACT)
    if isinstance(w, Int4AsymWeight):
        if w.group_size != 32:
            raise UnsupportedFormatError(
                f"tensor {name!r}: Q4_1 needs group size 32, got int4_asym group {w.group_size}"
            )
        out_feat, in_feat = w.shape
        b = np.empty((out_feat, in_feat // 32, 20), np.uint8)
        b[..., 0:4] = w.scales().astype("<f2").view(np.uint8).reshape(out_feat, -1, 4)
        b[..., 4:] = pack_runs(w.codes()).reshape(out_feat, -1, 16)
        return "Q4_1", b.reshape(out_feat, -1), dict(_EXACT)
    if isinstance(w, Int4KWeight):
        return "Q4_K", _q4_k_blocks(name, w), dict(_EXACT)
    if not isinstance(w, QuantizedWeight):
        raise UnsupportedFormatError(
            f"tensor {name!r}: expected a QuantizedWeight, Int4AsymWeight, Int4KWeight or "
            f"GgufWeight, got {type(w).__name__}"
        )
    if w.group_size != 32 or w.in_feat % 32:
        raise UnsupportedFormatError(
            f"tensor {name!r}: Q4_0 needs group size 32 and in_feat a multiple of 32, "
            f"got group {w.group_size}, in_feat {w.in_feat}"
        )
    return ("Q4_0", *_q4_0_blocks(w))


def _q4_k_blocks(name: str, w) -> np.ndarray:
    """``Q4_K`` bytes ``[out, in / 256 * 144]`` of an ``Int4KWeight`` whose super-blocks
    are 256 inputs. A ``Q4_K`` block (docs/formats.md "q4_k") is ``{f16 d, f16 dmin, u8
    scales[12], u8 qs[128]}``: sub-block ``j < 4`` keeps its 6-bit step / minimum in the
    low bits of ``scales[j]`` / ``scales[j + 4]``; sub-block ``j >= 4`` has its low four
    bits in ``scales[j + 4]`` (step low, minimum high) and its top two bits in the top
    bits of ``scales[j - 4]`` / ``scales[j]``; ``qs[32 c + l]`` holds input ``64 c + l``
    in its low nibble and ``64 c + 32 + l`` in its high one."""
    out_feat, in_feat = w.shape
    if w.super_block != 256:
        raise UnsupportedFormatError(
            f"tensor {name!r}: Q4_K needs super-blocks of 256 inputs (in_feat a multiple of "
            f"256), got int4_k super-block {w.super_block} (in_feat {in_feat})"
        )
    supers = in_feat // 256
    q = w.codes().reshape(out_feat, supers, 4, 2, 32)  # [.., chunk of 64, half, lane]
    sm = w.scale_codes().reshape(out_feat, supers, 8, 2)
    sc, mn = sm[..., 0], sm[..., 1]
    b = np.empty((out_feat, supers, 144), np.uint8)
    b[..., 0:4] = w.supers().astype("<f2").view(np.uint8).reshape(out_feat, supers, 4)
    b[..., 4:8] = sc[..., :4] | (sc[..., 4:] >> 4) << 6
    b[..., 8:12] = mn[..., :4] | (mn[..., 4:] >> 4) << 6
    b[..., 12:16] = (sc[..., 4:] & 0x0F) | (mn[..., 4:] & 0x0F) << 4
    b[..., 16:] = (q[..., 0, :] | q[..., 1, :] << 4).reshape(out_feat, supers, 128)
    return b.reshape(out_feat, -1)


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
    """Write ``{name: weight}`` to a GGUF file, tensors ``[out, in]`` (``ne = [in,
    out]``): a ``QuantizedWeight`` (group 32, ``in_feat`` a multiple of 32) as ``Q4_0``
    with its scales rounded to F16, an ``Int4AsymWeight`` of group 32 as ``Q4_1``, an
    ``Int4KWeight`` with super-blocks of 256 inputs as ``Q4_K`` and a ``GgufWeight`` as
    its own type, the last three exactly. One report row per tensor says how
    much the F16 rounding changed the scales and the weight (0 for the exact ones). The
    file is written to a temporary sibling and renamed: it appears complete or not at
    all."""
    path = Path(path)
    blocks, rows = [], []
    for name, qw in tensors.items():
        if not isinstance(name, str) or not name:
            raise UnsupportedFormatError(f"tensor name {name!r}: expected a non-empty string")
        gtype, b, rep = _blocks_of(name, qw)
        # QuantizedWeight has no ``shape``; a GgufWeight of type Q4_0 does
        out_feat, in_feat = (qw.out_feat, qw.in_feat) if hasattr(qw, "out_feat") else qw.shape
        blocks.append((name, (in_feat, out_feat, _TYPE_IDS[gtype]), b))
        rows.append({"name": name, "shape": [out_feat, in_feat], "type": gtype, **rep})
    kv = [
        _kv_string("general.architecture", architecture),
        _kv_u32("general.quantization_version", 2),
    ]
    head = MAGIC + struct.pack("<IQQ", VERSION, len(blocks), len(kv)) + b"".join(kv)
    offset = 0
    offsets = []
    for name, (in_feat, out_feat, type_id), b in blocks:
        offsets.append(offset)
        n = name.encode()
        head += (
            struct.pack("<Q", len(n))
            + n
            + struct.pack("<IQQIQ", 2, in_feat, out_feat, type_id, offset)
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
