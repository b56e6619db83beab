"""Per-tensor FP8 E4M3 checkpoints: the dialects producers write, reading any of them,
and the layouts and ``quantization_config`` that ``quantrs quantize --format fp8``
writes (docs/checkpoints.md).

Dialects of a layer ``p`` whose ``p.weight`` is F8_E4M3 ``[out, in]`` (all mean
``W = decode(codes) * scale``; an activation scale ``s_a`` means ``x_q = encode(x / s_a)``):

============================  =======================================  ====================
dialect                       weight scale                             activation scale
============================  =======================================  ====================
``compressed-tensors``        ``weight_scale`` ``[1]`` (or ``[]``),    ``input_scale``
                              F32 / BF16 / F16 (llm-compressor)
``fp8``                       ``weight_scale`` ``[]`` F32 (AutoFP8,    ``input_scale`` ``[]``
                              vLLM ``quant_method: fp8``)
``mistralrs``                 ``weight_scale_inv`` ``[]`` F32          ``activation_scale``
``per-channel``               ``weight_scale`` ``[out, 1]`` / ``[out]``
                              (FBGEMM, FP8_DYNAMIC)
``block-128``                 ``weight_scale_inv`` ``[ceil(out/128),
                              ceil(in/128)]`` (DeepSeek, FineGrainedFP8)
============================  =======================================  ====================

The first three are per-tensor and read as they are (also by the Rust
``PerTensorFP8Linear.from_safetensors``, ``src/fp8_dialect.rs``, which uses the same
rules). The last two are not: :func:`load_fp8` refuses them, or with
``requantize=True`` dequantizes and re-quantizes per tensor, warning with the error.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, RequantizedWarning, UnsupportedFormatError

PER_TENSOR = ("compressed-tensors", "fp8", "mistralrs")
LAYOUTS = ("compressed-tensors", "mistralrs")


@dataclass(frozen=True)
class Fp8Layer:
    """Where a layer's FP8 tensors are and which dialect they follow."""

    dialect: str
    weight: str
    scale: str | None
    act_scale: str | None
    bias: str | None


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def classify(weight: str, info, quant_method: str | None = None) -> Fp8Layer:
    """The dialect of the FP8 tensor ``weight``; ``info(name)`` gives a tensor's header
    entry (``.shape``, ``.dtype``) or None. ``quant_method`` from config.json settles
    the ``[]`` vs ``[1]`` ambiguity between compressed-tensors and AutoFP8."""
    prefix = weight[: -len("weight")] if weight.endswith("weight") else weight + "_"
    w = info(weight)

    def find(name):
        return name if info(name) is not None else None

    bias = find(prefix + "bias") if prefix.endswith(".") else None
    if (s := find(weight + "_scale_inv")) is not None:
        t = info(s)
        if _numel(t.shape) == 1:
            return Fp8Layer("mistralrs", weight, s, find(prefix + "activation_scale"), bias)
        return Fp8Layer(_non_per_tensor(t.shape, w.shape), weight, s, None, bias)
    if (s := find(weight + "_scale")) is not None:
        t = info(s)
        act = find(prefix + "input_scale")
        if _numel(t.shape) != 1:
            return Fp8Layer(_non_per_tensor(t.shape, w.shape), weight, s, act, bias)
        if quant_method in ("compressed-tensors", "fp8"):
            d = quant_method
        else:
            d = "fp8" if t.shape == () and t.dtype == "F32" else "compressed-tensors"
        return Fp8Layer(d, weight, s, act, bias)
    return Fp8Layer("no scale", weight, None, None, bias)


def _non_per_tensor(sshape, wshape) -> str:
    if len(wshape) == 2:
        out, inp = wshape
        if tuple(sshape) in ((out, 1), (out,)):
            return "per-channel"
        if tuple(sshape) == (-(-out // 128), -(-inp // 128)):
            return "block-128"
    return "unknown scale layout"


def _scalar(ck: Checkpoint, name: str) -> float:
    return float(ck.float32(name).reshape(-1)[0])


def load_fp8(path: str | os.PathLike, prefix: str, requantize: bool = False):
    """The FP8 layer ``prefix`` (its ``prefix.weight`` F8_E4M3) of a safetensors file
    or model folder, in any dialect, as a ``PerTensorFP8Linear``. Per-tensor dialects
    are read exactly; per-channel and 128x128 block scales raise :class:`FormatError`,
    or with ``requantize=True`` are dequantized and re-quantized per tensor (a
    :class:`RequantizedWarning` gives the error)."""
    with Checkpoint(path) as ck:
        return read_fp8(ck, prefix, requantize)


def read_fp8(ck: Checkpoint, prefix: str, requantize: bool = False):
    """:func:`load_fp8` on an open checkpoint."""
    from .. import PerTensorFP8Linear
    from .. import fp8 as codec

    weight = f"{prefix}.weight" if prefix else "weight"
    t = ck.info(weight)
    if t.dtype != "F8_E4M3":
        raise CorruptCheckpointError(f"tensor {weight!r}: expected dtype F8_E4M3, got {t.dtype}")
    qm = str(ck.quant_settings().get("quant_method", "")) or None
    layer = classify(weight, lambda n: ck.info(n) if n in ck else None, qm)
    bias = ck.float32(layer.bias) if layer.bias else None
    act = _scalar(ck, layer.act_scale) if layer.act_scale else None
    codes = ck.array(weight)
    if layer.dialect in PER_TENSOR:
        return PerTensorFP8Linear(codes, _scalar(ck, layer.scale), act, bias)
    if layer.dialect not in ("per-channel", "block-128"):
        raise UnsupportedFormatError(f"FP8 layer {prefix!r}: {layer.dialect}")
    reason = f"{layer.dialect} scales ({layer.scale!r})"
    if not requantize:
        raise UnsupportedFormatError(
            f"FP8 layer {prefix!r}: {reason} are not per-tensor (pass requantize=True "
            "to dequantize and re-quantize it per tensor)"
        )
    scales = ck.float32(layer.scale)
    w = codec.decode(codes, "e4m3")
    if layer.dialect == "per-channel":
        w *= scales.reshape(-1, 1)
    else:
        rows, cols = w.shape
        w *= np.repeat(np.repeat(scales, 128, 0), 128, 1)[:rows, :cols]
    new = PerTensorFP8Linear.from_float(w, bias, act)
    got = codec.decode(np.asarray(new.weight), "e4m3") * np.float32(new.weight_scale_inv)
    d = (w - got).astype(np.float64)
    den = float(np.sqrt(np.square(w, dtype=np.float64).sum()))
    rel = float(np.sqrt(np.square(d).sum())) / den if den else 0.0
    warnings.warn(
        RequantizedWarning(
            f"FP8 layer {prefix!r}: {reason} re-quantized per tensor: relative error "
            f"{rel:.3e}, max |error| {float(np.abs(d).max(initial=0)):.3e}"
        ),
        stacklevel=3,
    )
    return new


# --- what quantize writes ----------------------------------------------------------------


def scale_name(name: str, layout: str) -> str:
    """The scale tensor ``quantize`` writes next to FP8 tensor ``name``."""
    return name + ("_scale" if layout == "compressed-tensors" else "_scale_inv")


def quantization_config(layout: str, ignore: list[str]) -> dict:
    """The ``config.json`` ``quantization_config`` of an FP8 folder ``quantize`` wrote.

    ``compressed-tensors``: the llm-compressor ``float-quantized`` scheme (per-tensor
    static weights, no activation scheme: vLLM loads it as weight-only FP8);
    ``ignore`` names the modules left unquantized. ``mistralrs``: the
    transformers ``fp8`` config with per-tensor scales (``weight_block_size`` null)."""
    if layout == "compressed-tensors":
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 8,
                        "type": "float",
                        "strategy": "tensor",
                        "symmetric": True,
                        "dynamic": False,
                    },
                    "input_activations": None,
                    "output_activations": None,
                }
            },
            "ignore": ignore,
            "kv_cache_scheme": None,
            "producer": "quantrs",
        }
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": None,
        "modules_to_not_convert": ignore,
        "producer": "quantrs",
        "layout": "mistralrs",
    }
