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
quantrs INT4 exactly when it is 4-bit, every zero point is 8 (symmetric) and
``g_idx[i] == i // group_size`` (no act-order permutation): then the signed code is
``q - 8`` and the F16 scale is the float32 scale. Anything else is refused, or with
``requantize=True`` dequantized and re-quantized, the error reported.
"""

from __future__ import annotations

import os

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, UnsupportedFormatError
from ._int4 import Imported, from_offset8, requantize, unpack_int32
from ._layer_checks import group_size_of, packed_tensors

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


def read_gptq(ck: Checkpoint, prefix: str, requantize_ok: bool = False) -> Imported:
    """The layer ``prefix`` of an open checkpoint, as quantrs INT4 (see the module doc)."""
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

    q = unpack_int32(np.ascontiguousarray(ck.array(names["qweight"]).T), bits).T  # [in, out]
    zeros = unpack_int32(ck.array(names["qzeros"]), bits).astype(np.int32)  # [groups, out]
    if geo["version"] == 1:
        # v1 stores zero - 1 in the field (s * (q - (z + 1))); a zero point of 0 was
        # stored as -1, i.e. all ones, so the + 1 wraps within the field
        zeros = (zeros + 1) & ((1 << bits) - 1)
    scales = ck.float32(names["scales"])

    reasons = []
    if bits != 4:
        reasons.append(f"{bits}-bit codes")
    if not np.array_equal(g_idx, trivial):
        reasons.append("act-order g_idx (rows permuted across groups)")
    if bits == 4 and not (zeros == 8).all():
        reasons.append("asymmetric zero points (not all 8)")
    if not reasons:
        return Imported(from_offset8(np.ascontiguousarray(q), scales, gs, what), bias)
    reason = ", ".join(reasons)
    if not requantize_ok:
        raise UnsupportedFormatError(
            f"{what}: {reason}: not representable in quantrs INT4 (pass requantize=True / "
            "--requantize to dequantize and re-quantize it)"
        )
    w = scales[g_idx] * (q.astype(np.float32) - zeros[g_idx].astype(np.float32))
    qw, err = requantize(w, gs, what, reason)
    return Imported(qw, bias, err, reason)


def load_gptq(path: str | os.PathLike, prefix: str, requantize: bool = False):
    """The GPTQ layer ``prefix`` (e.g. ``model.layers.0.mlp.up_proj``) of a safetensors
    file or model folder as an ``Int4Linear`` (bias kept). Exact for symmetric 4-bit
    with a trivial ``g_idx``; otherwise a :class:`FormatError`, or with
    ``requantize=True`` a re-quantized layer and a :class:`RequantizedWarning`."""
    with Checkpoint(path) as ck:
        return read_gptq(ck, prefix, requantize).linear()
