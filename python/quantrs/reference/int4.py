"""INT4 reference: per-group symmetric absmax quantization, in pure NumPy.

The format (docs/int4.md, "The format"), for ``w`` of shape ``[in_feat, out_feat]``:

- ``gs = min(group_size, in_feat rounded up to even)``; rows are padded with
  zeros to ``in_padded``, a multiple of ``gs``; ``num_groups = in_padded // gs``.
- ``scale[g, o] = max(absmax(w[g*gs:(g+1)*gs, o]) / 7, 1e-8)`` in float32.
- ``q = clip(round_half_even(w / scale), -8, 7)`` (a true float32 division).
- ``data[p * out_feat + o]`` holds row ``2p`` in the low nibble and row
  ``2p + 1`` in the high nibble, as 4-bit two's complement.
"""

from __future__ import annotations

import numpy as np

from .._core import InvalidArgument


def _layout(in_feat: int, group_size: int) -> tuple[int, int, int]:
    if in_feat <= 0:
        raise InvalidArgument(f"in_feat: expected >= 1, got {in_feat}")
    if group_size < 2 or group_size % 2:
        raise InvalidArgument(f"group_size: expected even and >= 2, got {group_size}")
    gs = min(group_size, in_feat + (in_feat % 2))
    in_padded = -(-in_feat // gs) * gs
    return gs, in_padded, in_padded // gs


def quantize_int4(w: np.ndarray, group_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(q, scales)``: int8 codes ``[in_padded, out_feat]`` and float32
    scales ``[num_groups, out_feat]``."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise InvalidArgument(f"w: expected 2-D [in_feat, out_feat], got shape {w.shape}")
    in_feat, out_feat = w.shape
    gs, in_padded, num_groups = _layout(in_feat, group_size)
    if not np.all(np.isfinite(w)):
        raise InvalidArgument("w: expected finite values, got NaN or infinity")
    wp = np.zeros((in_padded, out_feat), dtype=np.float32)
    wp[:in_feat] = w
    groups = wp.reshape(num_groups, gs, out_feat)
    absmax = np.abs(groups).max(axis=1)
    scales = np.maximum(absmax / np.float32(7.0), np.float32(1e-8)).astype(np.float32)
    q = np.round(groups / scales[:, None, :])  # np.round: ties to even
    q = np.clip(q, -8, 7).astype(np.int8).reshape(in_padded, out_feat)
    return q, scales


def _fake_quantize_int4(w: np.ndarray, group_size: int = 32) -> np.ndarray:
    """Quantize and dequantize: float32 ``[in_feat, out_feat]``."""
    w = np.asarray(w, dtype=np.float32)
    q, scales = quantize_int4(w, group_size)
    in_feat, out_feat = w.shape
    gs = q.shape[0] // scales.shape[0]
    deq = q.reshape(scales.shape[0], gs, out_feat).astype(np.float32) * scales[:, None, :]
    return deq.reshape(-1, out_feat)[:in_feat].astype(np.float32)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Pack int8 codes ``[in_padded, out_feat]`` (values in [-8, 7], even row
    count) into the byte layout of ``QuantizedWeight.data``, flat
    ``uint8[in_padded // 2 * out_feat]``."""
    q = np.asarray(q, dtype=np.int8)
    if q.ndim != 2 or q.shape[0] % 2:
        raise InvalidArgument(f"q: expected 2-D with an even row count, got shape {q.shape}")
    lo = q[0::2].astype(np.uint8) & 0x0F
    hi = q[1::2].astype(np.uint8) & 0x0F
    return (lo | (hi << 4)).astype(np.uint8).reshape(-1)


def unpack_int4(data: np.ndarray, out_feat: int) -> np.ndarray:
    """Inverse of :func:`pack_int4`: int8 codes ``[in_padded, out_feat]``."""
    b = np.asarray(data, dtype=np.uint8).reshape(-1, out_feat)
    lo = (b & 0x0F).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    lo = np.where(lo > 7, lo - 16, lo).astype(np.int8)
    hi = np.where(hi > 7, hi - 16, hi).astype(np.int8)
    q = np.empty((b.shape[0] * 2, out_feat), dtype=np.int8)
    q[0::2] = lo
    q[1::2] = hi
    return q
