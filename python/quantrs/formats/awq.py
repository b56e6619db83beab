"""AWQ checkpoints (AutoAWQ ``GEMM`` packing), read into quantrs INT4.

Per layer ``prefix`` (docs/checkpoints.md):

- ``qweight`` int32 ``[in, out / 8]``: eight 4-bit codes per word along the *output*
  dimension, field ``j`` (bits ``4j..4j+3``) holding column ``8 c + ORDER[j]`` with
  ``ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``;
- ``qzeros`` int32 ``[groups, out / 8]``, packed the same way; ``scales`` F16
  ``[groups, out]``; ``bias`` (optional).

The weight is ``scales[g, o] * (q[i, o] - zeros[g, o])`` with ``g = i // group_size``,
read exactly, codes kept packed: into quantrs INT4 when every zero point is 8, else into
:class:`quantrs.IntZpWeight` (inputs and group size multiples of 32, float16 scales;
docs/checkpoints.md). Anything else (``GEMV`` packing, other bit widths) is refused, or,
for zero points and shapes, with ``requantize=True`` dequantized and re-quantized to INT4
with the error reported.
"""

from __future__ import annotations

import os

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, UnsupportedFormatError
from ._int4 import Imported, check_into, from_offset8, requantize, unpack_int32
from ._layer_checks import group_size_of, packed_tensors
from ._zero_point import half_scales, layout_reason, zp_weight

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_settings(ck: Checkpoint) -> dict:
    q = ck.quant_settings()
    method = str(q.get("quant_method", "awq")).lower()
    if method != "awq":
        raise UnsupportedFormatError(f"{ck.path}: quant_method is {method!r}, not awq")
    version = str(q.get("version", "gemm")).lower()
    if version != "gemm":
        raise UnsupportedFormatError(
            f"{ck.path}: AWQ version {version!r}: only the GEMM packing is read"
        )
    bits = int(q.get("bits", q.get("w_bit", 4)))
    if bits != 4:
        raise UnsupportedFormatError(f"{ck.path}: {bits}-bit AWQ is not supported (4-bit is)")
    return {"group_size": int(q.get("group_size", q.get("q_group_size", 0)) or 0)}


def awq_layers(ck: Checkpoint) -> list[str]:
    return [n[: -len(".qweight")] for n in ck.names() if n.endswith(".qweight")]


def awq_geometry(ck: Checkpoint, prefix: str) -> dict:
    """Sizes of layer ``prefix`` from the headers alone: ``in_feat``, ``out_feat``,
    ``groups``, ``group_size``."""
    cfg = awq_settings(ck)
    what = f"AWQ layer {prefix!r}"
    tq, tz, ts = packed_tensors(ck, prefix, what, ("F16", "F32", "BF16"))
    in_feat, out_feat = tq.shape[0], tq.shape[1] * 8
    groups = ts.shape[0]
    if ts.shape[1] != out_feat or tz.shape != (groups, tq.shape[1]):
        raise CorruptCheckpointError(
            f"{what}: inconsistent shapes qweight {list(tq.shape)}, qzeros {list(tz.shape)}, "
            f"scales {list(ts.shape)} (expected scales [groups, {out_feat}], qzeros "
            f"[groups, {tq.shape[1]}])"
        )
    gs = group_size_of(what, in_feat, groups, cfg["group_size"])
    return {"in_feat": in_feat, "out_feat": out_feat, "groups": groups, "group_size": gs}


def read_awq(
    ck: Checkpoint, prefix: str, requantize_ok: bool = False, into: str = "exact"
) -> Imported:
    """The layer ``prefix`` of an open checkpoint (see the module doc): quantrs INT4 where
    that is exact, else (``into="exact"``) an :class:`quantrs.IntZpWeight`; with
    ``into="int4"`` (what ``quantrs convert`` writes) only INT4."""
    check_into(into)
    geo = awq_geometry(ck, prefix)
    in_feat, out_feat, gs = geo["in_feat"], geo["out_feat"], geo["group_size"]
    what = f"AWQ layer {prefix!r}"
    names = {k: f"{prefix}.{k}" for k in ("qweight", "qzeros", "scales", "bias")}
    bias = ck.float32(names["bias"]) if names["bias"] in ck else None
    if bias is not None and bias.shape != (out_feat,):
        raise CorruptCheckpointError(
            f"tensor {names['bias']!r}: expected [{out_feat}], got {list(bias.shape)}"
        )

    q = unpack_int32(ck.array(names["qweight"]), 4, ORDER)  # [in, out]
    zeros = unpack_int32(ck.array(names["qzeros"]), 4, ORDER)  # [groups, out]
    if (zeros == 8).all():
        return Imported(from_offset8(q, ck.float32(names["scales"]), gs, what), bias)
    reason = "zero points other than 8 (asymmetric)"
    if into == "exact":
        half, why = half_scales(ck.array(names["scales"]), ck.info(names["scales"]))
        zp_why = [r for r in (layout_reason(in_feat, gs, 4), why) if r]
        if not zp_why:
            return Imported(zp_weight(q.T, half, zeros, None, gs, 4), bias)
        reason += f"; int_zp: {', '.join(zp_why)}"
    target = "quantrs INT4" if into == "int4" else "quantrs INT4 or int_zp"
    if not requantize_ok:
        raise UnsupportedFormatError(
            f"{what}: {reason}: not representable in {target} (pass requantize=True / "
            "--requantize to dequantize and re-quantize it)"
        )
    scales = ck.float32(names["scales"])
    g = np.arange(in_feat) // gs
    w = scales[g] * (q.astype(np.float32) - zeros[g].astype(np.float32))
    qw, err = requantize(w, gs, what, reason)
    return Imported(qw, bias, err, reason)


def load_awq(path: str | os.PathLike, prefix: str, requantize: bool = False):
    """The AWQ (GEMM) layer ``prefix`` of a safetensors file or model folder as a quantrs
    layer, bias kept, exactly: an ``Int4Linear`` when every zero point is 8, else a
    ``QuantLinear`` of format ``int_zp``; what neither holds is a :class:`FormatError`,
    or with ``requantize=True`` a re-quantized ``Int4Linear`` and a
    :class:`RequantizedWarning`. In PyTorch: ``quantrs.torch.GgufLinear(read_awq(...).qweight,
    bias)``."""
    with Checkpoint(path) as ck:
        return read_awq(ck, prefix, requantize).linear()
