"""From offset-8 4-bit codes (what GPTQ, AWQ and GGUF ``Q4_0`` store) to quantrs's
``QuantizedWeight`` layout, and the re-quantization fallback.

quantrs (docs/int4.md): ``data[pair * out + o]`` holds input row ``2 * pair`` in the low
nibble and row ``2 * pair + 1`` in the high one, as 4-bit two's complement; scales
``[groups, out]`` float32, groups along the input dimension. An unsigned code ``q`` in
0..15 with zero point 8 is the signed code ``q - 8``, whose two's-complement nibble is
``q ^ 8``: the import is a bit shuffle, and ``code * scale`` is the producer's own
``scale * (q - 8)``, in float32, bit for bit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ._errors import CorruptCheckpointError, RequantizedWarning


def int4_layout(in_feat: int, group_size: int) -> tuple[int, int, int]:
    """``(effective group size, num_pairs, num_groups)`` of a ``QuantizedWeight`` with
    ``in_feat`` inputs (docs/int4.md): the group is capped at ``in_feat`` rounded up to
    even, and the rows are zero-padded to whole groups."""
    gs = min(group_size, in_feat + in_feat % 2)
    in_padded = -(-in_feat // gs) * gs
    return gs, in_padded // 2, in_padded // gs


# What a GPTQ / AWQ reader may return: "exact" (INT4 where that is exact, else
# IntZpWeight) or "int4" (INT4 only: what quantrs convert writes).
INTO = ("exact", "int4")


def check_into(into: str) -> None:
    """``into`` is one of :data:`INTO` (else ``InvalidArgument`` naming it)."""
    if into not in INTO:
        from .._core import InvalidArgument

        raise InvalidArgument(f"into: expected one of {INTO}, got {into!r}")


@dataclass
class Imported:
    """One imported weight: the ``QuantizedWeight`` (or, for zero points INT4 cannot
    hold, the ``IntZpWeight``), the bias (float32 or None), and, when it was
    re-quantized, the relative Frobenius and max-abs error."""

    qweight: object
    bias: np.ndarray | None = None
    error: tuple[float, float] | None = None
    note: str = ""

    def linear(self):
        """The quantrs layer: ``Int4Linear``, or a ``QuantLinear`` of format ``int_zp``."""
        from .. import Int4Linear, IntZpWeight

        if isinstance(self.qweight, IntZpWeight):
            return self.qweight.to_layer(self.bias)
        return Int4Linear(self.qweight, self.bias)


def from_offset8(q: np.ndarray, scales: np.ndarray, group_size: int, what: str):
    """``QuantizedWeight`` from unsigned codes ``q`` ``[in, out]`` (0..15, zero point 8)
    and float32 ``scales`` ``[groups, out]`` with ``groups = ceil(in / group_size)``."""
    from .. import QuantizedWeight

    in_feat, out_feat = q.shape
    gs, pairs, groups = int4_layout(in_feat, group_size)
    if scales.shape != (groups, out_feat):
        raise CorruptCheckpointError(
            f"{what}: scales shape {list(scales.shape)}, expected [{groups}, {out_feat}] for "
            f"{in_feat} inputs in groups of {group_size}"
        )
    nib = np.zeros((2 * pairs, out_feat), np.uint8)  # padding rows: code 0
    np.bitwise_xor(q, np.uint8(8), out=nib[:in_feat])
    data = nib[0::2] | (nib[1::2] << np.uint8(4))
    return QuantizedWeight(
        data.reshape(-1),
        np.ascontiguousarray(scales, np.float32).reshape(-1),
        in_feat,
        out_feat,
        groups,
    )


def requantize(w_in_out: np.ndarray, group_size: int, what: str, reason: str) -> tuple:
    """Re-quantize a float32 ``[in, out]`` weight with ``QuantizedWeight.quantize``'s
    default quantizer (``"search"``, the least squared error per group); warn
    with the error. Returns ``(QuantizedWeight, (rel_err, max_abs_err))``."""
    from .. import QuantizedWeight

    if not np.isfinite(w_in_out).all():
        raise CorruptCheckpointError(f"{what}: the dequantized weight holds non-finite values")
    gs = group_size if group_size >= 2 and group_size % 2 == 0 else 32
    qw = QuantizedWeight.quantize(
        np.ascontiguousarray(w_in_out, np.float32), group_size=gs, method="search"
    )
    d = w_in_out.astype(np.float64) - qw.dequantize()
    den = float(np.sqrt(np.square(w_in_out, dtype=np.float64).sum()))
    err = (
        float(np.sqrt(np.square(d).sum())) / den if den else 0.0,
        float(np.abs(d).max(initial=0)),
    )
    warnings.warn(
        RequantizedWarning(
            f"{what}: {reason}; re-quantized to quantrs INT4 (group {gs}): relative error "
            f"{err[0]:.3e}, max |error| {err[1]:.3e}"
        ),
        stacklevel=3,
    )
    return qw, err


def unpack_int32(words: np.ndarray, bits: int, order: list[int] | None = None) -> np.ndarray:
    """Unpack ``bits``-bit fields of int32 words along their last axis: field ``j`` of a
    word is bits ``[bits * j, bits * (j + 1))`` (least significant first); ``order[j]``
    (default ``j``) is the position it lands in. ``[..., n] -> [..., n * 32 / bits]``."""
    per = 32 // bits
    u = words.view(np.uint32)
    out = np.empty((*u.shape, per), np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for j in range(per):
        dst = j if order is None else order[j]
        out[..., dst] = (u >> np.uint32(bits * j)) & mask
    return out.reshape(*u.shape[:-1], u.shape[-1] * per)
