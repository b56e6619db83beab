"""GPTQ checkpoints (AutoGPTQ / GPTQModel), read into quantrs INT4.

Per layer ``prefix`` (facts from the producers' packing, docs/checkpoints.md):

- ``qweight`` int32 ``[in / 8, out]``: eight 4-bit codes per word along the input
  dimension, least significant nibble first (row ``8 r + j`` is bits ``4j..4j+3``);
- ``qzeros`` int32 ``[groups, out / 8]``: zero points packed the same way along the
  output dimension, stored as ``zero - 1`` by the v1 format (``checkpoint_format``
  ``"gptq"``, the default) and as ``zero`` by v2 (``"gptq_v2"``);
- ``scales`` F16 ``[groups, out]``; ``g_idx`` int32 ``[in]``: the group of each input row;
- ``bias`` (optional).

The dequantized weight is ``scales[g_idx[i], o] * (q[i, o] - zero[g_idx[i], o])``. It is
read exactly, codes kept packed:

- into quantrs INT4 when it is 4-bit, every zero point is 8 (symmetric) and
  ``g_idx[i] == i // group_size`` (no act-order permutation): then the signed code is
  ``q - 8`` and the F16 scale is the float32 scale (the layout every earlier quantrs
  read gave, unchanged);
- otherwise into :class:`quantrs.IntZpWeight` (4- or 8-bit, any zero points, v1 or v2,
  act-order ``g_idx`` sorted once into contiguous groups, ``group_size`` -1 = one group
  per row), when the inputs and the group size are multiples of 32 and the scales are
  float16 (docs/checkpoints.md).

Anything else (2-bit codes, other layouts) is refused naming the reason, or with
``requantize=True`` dequantized and re-quantized to INT4, the error reported.
"""

from __future__ import annotations

import os

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, UnsupportedFormatError
from ._int4 import Imported, check_into, from_offset8, requantize, unpack_int32
from ._layer_checks import group_size_of, packed_tensors
from ._zero_point import act_order, half_scales, layout_reason, unpack_rows, zp_weight

_SCALE_DTYPES = ("F16", "F32", "BF16")


def gptq_settings(ck: Checkpoint) -> dict:
    """``bits``, ``group_size``, ``version`` (1 or 2) from the checkpoint's config."""
    q = ck.quant_settings()
    method = str(q.get("quant_method", "gptq")).lower()
    if method not in ("gptq", ""):
        raise UnsupportedFormatError(f"{ck.path}: quant_method is {method!r}, not gptq")
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedFormatError(f"{ck.path}: checkpoint_format {fmt!r} is not gptq or gptq_v2")
    return {
        "bits": int(q.get("bits", 4)),
        "group_size": int(q.get("group_size", 0) or 0),
        "version": 2 if fmt == "gptq_v2" else 1,
    }


def gptq_layers(ck: Checkpoint) -> list[str]:
    """The prefixes of every GPTQ layer (``<prefix>.qweight``) in the checkpoint."""
    return [n[: -len(".qweight")] for n in ck.names() if n.endswith(".qweight")]


def gptq_geometry(ck: Checkpoint, prefix: str) -> dict:
    """Sizes of layer ``prefix`` from the headers alone (nothing read yet):
    ``in_feat``, ``out_feat``, ``groups``, ``group_size``, ``bits``."""
    cfg = gptq_settings(ck)
    bits = cfg["bits"]
    what = f"GPTQ layer {prefix!r}"
    if bits not in (2, 4, 8):
        raise UnsupportedFormatError(
            f"{what}: {bits}-bit packing is not supported (2, 4 and 8 are)"
        )
    per = 32 // bits
    tq, tz, ts = packed_tensors(ck, prefix, what, _SCALE_DTYPES)
    in_feat, out_feat = tq.shape[0] * per, tq.shape[1]
    groups = ts.shape[0]
    if ts.shape[1] != out_feat or out_feat % per or tz.shape != (groups, out_feat // per):
        raise CorruptCheckpointError(
            f"{what}: inconsistent shapes qweight {list(tq.shape)}, qzeros {list(tz.shape)}, "
            f"scales {list(ts.shape)} (expected qzeros [{groups}, {out_feat // per}], "
            f"scales [groups, {out_feat}])"
        )
    gs = group_size_of(what, in_feat, groups, cfg["group_size"])
    return {
        "in_feat": in_feat,
        "out_feat": out_feat,
        "groups": groups,
        "group_size": gs,
        "bits": bits,
        "version": cfg["version"],
    }


def read_gptq(
    ck: Checkpoint, prefix: str, requantize_ok: bool = False, into: str = "exact"
) -> Imported:
    """The layer ``prefix`` of an open checkpoint (see the module doc): quantrs INT4 where
    that is exact, else (``into="exact"``) an :class:`quantrs.IntZpWeight`; with
    ``into="int4"`` (what ``quantrs convert`` writes) only INT4."""
    check_into(into)
    geo = gptq_geometry(ck, prefix)
    in_feat, out_feat, groups, gs, bits = (
        geo[k] for k in ("in_feat", "out_feat", "groups", "group_size", "bits")
    )
    what = f"GPTQ layer {prefix!r}"
    names = {k: f"{prefix}.{k}" for k in ("qweight", "qzeros", "scales", "g_idx", "bias")}
    trivial = np.arange(in_feat, dtype=np.int64) // gs
    if names["g_idx"] in ck:
        g_idx = ck.array(names["g_idx"], ("I32", "I64")).astype(np.int64)
        if g_idx.shape != (in_feat,) or (
            g_idx.size and not (0 <= g_idx.min() <= g_idx.max() < groups)
        ):
            raise CorruptCheckpointError(
                f"tensor {names['g_idx']!r}: expected [{in_feat}] group indices in "
                f"[0, {groups}), got shape {list(g_idx.shape)}"
            )
    else:
        g_idx = trivial
    bias = ck.float32(names["bias"]) if names["bias"] in ck else None
    if bias is not None and bias.shape != (out_feat,):
        raise CorruptCheckpointError(
            f"tensor {names['bias']!r}: expected [{out_feat}], got {list(bias.shape)}"
        )

    qweight = ck.array(names["qweight"])
    zeros = unpack_int32(ck.array(names["qzeros"]), bits)  # [groups, out]
    if geo["version"] == 1:
        # v1 stores zero - 1 in the field (s * (q - (z + 1))); a zero point of 0 was
        # stored as -1, i.e. all ones, so the + 1 wraps within the field
        zeros = (zeros + np.uint8(1)) & np.uint8((1 << bits) - 1)
    raw_scales = ck.array(names["scales"])
    trivial_order = np.array_equal(g_idx, trivial)
    if bits == 4 and trivial_order and (zeros == 8).all():
        q = unpack_int32(np.ascontiguousarray(qweight.T), bits).T  # [in, out]
        scales = ck.float32(names["scales"])
        return Imported(from_offset8(np.ascontiguousarray(q), scales, gs, what), bias)

    reasons = []
    if bits != 4:
        reasons.append(f"{bits}-bit codes")
    if not trivial_order:
        reasons.append("act-order g_idx (rows permuted across groups)")
    if bits == 4 and not (zeros == 8).all():
        reasons.append("asymmetric zero points (not all 8)")
    reason = ", ".join(reasons)
    if into == "exact":
        perm, order_why = act_order(g_idx, groups, gs)
        half, half_why = half_scales(raw_scales, ck.info(names["scales"]))
        zp_why = [r for r in (layout_reason(in_feat, gs, bits), order_why, half_why) if r]
        if not zp_why:
            q = unpack_rows(qweight, bits)  # [out, in]
            return Imported(zp_weight(q, half, zeros, perm, gs, bits), bias)
        reason += f"; int_zp: {', '.join(zp_why)}"
    target = "quantrs INT4" if into == "int4" else "quantrs INT4 or int_zp"
    if not requantize_ok:
        raise UnsupportedFormatError(
            f"{what}: {reason}: not representable in {target} (pass requantize=True / "
            "--requantize to dequantize and re-quantize it)"
        )
    q = unpack_int32(np.ascontiguousarray(qweight.T), bits).T  # [in, out]
    scales = ck.float32(names["scales"])
    w = scales[g_idx] * (q.astype(np.float32) - zeros[g_idx].astype(np.float32))
    qw, err = requantize(w, gs, what, reason)
    return Imported(qw, bias, err, reason)


def load_gptq(path: str | os.PathLike, prefix: str, requantize: bool = False):
    """The GPTQ layer ``prefix`` (e.g. ``model.layers.0.mlp.up_proj``) of a safetensors
    file or model folder as a quantrs layer, bias kept, exactly: an ``Int4Linear`` for
    symmetric 4-bit with a trivial ``g_idx``, else a ``QuantLinear`` of format
    ``int_zp`` (asymmetric, 8-bit, act-order); what neither holds is a
    :class:`FormatError`, or with ``requantize=True`` a re-quantized ``Int4Linear`` and a
    :class:`RequantizedWarning`. In PyTorch: ``quantrs.torch.GgufLinear(read_gptq(...).qweight,
    bias)``."""
    with Checkpoint(path) as ck:
        return read_gptq(ck, prefix, requantize).linear()
