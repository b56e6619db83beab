"""GPTQ / AWQ groups into :class:`quantrs.IntZpWeight` exactly (docs/checkpoints.md):
per group of inputs of one output row a float16 scale ``s`` and an integer zero point
``z``, ``w = s * (q - z)`` in float32, the codes kept packed (4 or 8 bits) and no float
copy of the weight made.

Act-order (GPTQ ``desc_act``): ``g_idx[i]`` is the group of input ``i`` in an order of
GPTQ's own; a stable sort of the inputs by group makes every group contiguous (exllama
does the same once at load), the forward gathers ``x`` by that permutation once per
call. That is exact when the sorted groups have the sizes of a contiguous layout, which
is what GPTQ writes (``g_idx[perm[i]] = i // group_size``).
"""

from __future__ import annotations

import numpy as np

from ._errors import CorruptCheckpointError
from ._stfile import TensorInfo

# What the format holds (src/int_zp): codes of these widths, runs of 32 inputs.
ZP_BITS = (4, 8)
RUN = 32


def act_order(g_idx: np.ndarray, groups: int, group_size: int) -> tuple[np.ndarray | None, str]:
    """``(perm, "")`` with ``perm`` the stable sort of the inputs by ``g_idx`` (None when
    already sorted), or ``(None, reason)`` when the sorted groups are not the contiguous
    layout of ``group_size`` (then no permutation makes it exact)."""
    in_feat = g_idx.shape[0]
    want = np.full(groups, group_size, np.int64)
    want[-1] = in_feat - group_size * (groups - 1)
    if not np.array_equal(np.bincount(g_idx, minlength=groups), want):
        return None, "g_idx groups of other sizes than the group size"
    if (np.diff(g_idx) >= 0).all():
        return None, ""
    return np.argsort(g_idx, kind="stable"), ""


def half_scales(scales: np.ndarray, info: TensorInfo) -> tuple[np.ndarray | None, str]:
    """The scales (the checkpoint's raw array: F16, or F32 / BF16 as read) as float16
    ``[groups, out]``, or ``(None, reason)`` where a value is not a half; a non-finite
    scale is a corrupt tensor."""
    if info.dtype == "F16":
        f = scales.view(np.float16)
    elif info.dtype == "BF16":  # bfloat16 is the top half of a float32
        f = (scales.astype(np.uint32) << 16).view(np.float32)
    else:
        f = scales
    bad = np.argwhere(~np.isfinite(f))
    if bad.size:
        at = bad[0].tolist()
        raise CorruptCheckpointError(
            f"tensor {info.name!r}: scale {at} is {f[tuple(at)]}, expected finite"
        )
    with np.errstate(over="ignore"):
        h = f.astype(np.float16)
    if not np.array_equal(h.astype(np.float32), f.astype(np.float32)):
        return None, f"{info.dtype} scales that float16 cannot hold"
    return h, ""


def layout_reason(in_feat: int, group_size: int, bits: int) -> str:
    """Why the shapes do not fit the format ('' when they do)."""
    if bits not in ZP_BITS:
        return f"{bits}-bit codes"
    if in_feat % RUN or group_size % RUN:
        return f"{in_feat} inputs in groups of {group_size} (int_zp needs multiples of {RUN})"
    return ""


def zp_weight(
    q_out_in: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray,
    perm: np.ndarray | None,
    group_size: int,
    bits: int,
):
    """:class:`quantrs.IntZpWeight` from uint8 codes ``[out, in]`` (layer input order),
    float16 ``scales`` and uint8 ``zeros`` ``[groups, out]``; ``perm`` sorts the inputs
    into contiguous groups."""
    from .. import IntZpWeight

    codes = q_out_in if perm is None else np.take(q_out_in, perm, axis=1)
    return IntZpWeight.from_parts(
        np.ascontiguousarray(codes),
        np.ascontiguousarray(scales.T),
        np.ascontiguousarray(zeros.T),
        group_size=group_size,
        bits=bits,
        perm=perm,
    )


def unpack_rows(words: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ's ``qweight`` ``[in * bits / 32, out]`` (fields along the input dimension,
    least significant first) as uint8 codes ``[out, in]``, built row-major directly (no
    ``[in, out]`` intermediate)."""
    per = 32 // bits
    u = words.view(np.uint32)
    out = np.empty((u.shape[1], u.shape[0], per), np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for j in range(per):
        out[:, :, j] = ((u >> np.uint32(bits * j)) & mask).T
    return out.reshape(u.shape[1], u.shape[0] * per)
