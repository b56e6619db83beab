"""A whole model in one call: :func:`load_pretrained` builds a transformers model from a
Hugging Face folder (or a GGUF file) with every quantized linear served from the
checkpoint's packed bits (docs/checkpoints.md, "A whole model at once").

The skeleton comes from the folder's ``config.json`` with empty weights
(``accelerate.init_empty_weights`` when accelerate is installed: the parameters are
never allocated in float32); each ``nn.Linear`` whose checkpoint tensors are packed is
replaced by the quantrs module for its format, and every other tensor (embeddings,
norms, float linears) is assigned from the safetensors as the model's own parameter.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import IntZpWeight, PerTensorFP8Linear, QuantizedWeight
from ..formats import Checkpoint, CorruptCheckpointError, UnsupportedFormatError
from ..formats.awq import read_awq
from ..formats.fp8 import read_fp8
from ..formats.gptq import read_gptq
from ..formats.own_layout import ALL_FORMATS, own_entry, read_own
from ._gguf import GgufLinear, load_gguf_llama
from ._modules import FP8Linear, Int4Linear

# quant_method values of config.json's quantization_config this loader reads
_METHODS = ("gptq", "awq", "compressed-tensors", "fp8", "quantrs")


def load_pretrained(
    path: str | os.PathLike, *, requantize: bool = False, model_class=None
) -> nn.Module:
    """The model in ``path`` with its original bits, in eval mode.

    ``path``: a Hugging Face folder (``config.json`` and safetensors) whose linears are
    GPTQ (4 / 8-bit, sym / asym, v1 / v2, act-order), AWQ (GEMM), per-tensor FP8
    (compressed-tensors, AutoFP8, mistral.rs), quantrs INT4 (``quantrs quantize``) or
    float; or a ``.gguf`` file (:func:`quantrs.torch.load_gguf_llama`). A layer the
    formats cannot hold exactly raises :class:`quantrs.formats.FormatError` naming it,
    or with ``requantize=True`` is re-quantized with a warning. ``model_class``: the
    transformers class built from the config (default ``AutoModelForCausalLM``)."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return load_gguf_llama(p).eval()
    if not p.is_dir():
        if not p.exists():
            raise FileNotFoundError(2, "no such file or folder", str(p))
        raise UnsupportedFormatError(
            f"{p}: expected a model folder (config.json + safetensors) or a .gguf file"
        )
    with Checkpoint(p) as ck:
        if not ck.config:
            raise CorruptCheckpointError(f"{p}: no config.json to build the model from")
        method = _method_of(ck)
        if method and method not in _METHODS:
            raise UnsupportedFormatError(
                f"{p}: quant_method {method!r} is not one of {', '.join(_METHODS)}"
            )
        model = _skeleton(p, model_class)
        used: set[str] = set()
        for fqn, mod in list(model.named_modules()):
            if isinstance(mod, nn.Linear):
                new = _packed_linear(ck, fqn, mod, method, requantize, used)
                if new is not None:
                    model.set_submodule(fqn, new)
        _assign_rest(model, ck, used)
    return model.eval()


def _method_of(ck: Checkpoint) -> str:
    """``quant_method`` of the checkpoint's settings; AutoGPTQ's ``quantize_config.json``
    and AutoAWQ's ``quant_config.json`` often have none: AWQ's keys (``w_bit``,
    ``q_group_size``, ``version``) say AWQ, any other such file GPTQ."""
    q = ck.quant_settings()
    method = str(q.get("quant_method", "")).lower()
    if method or not q:
        return method
    return "awq" if {"w_bit", "q_group_size", "version"} & set(q) else "gptq"


@contextlib.contextmanager
def _empty_weights():
    try:
        from accelerate import init_empty_weights
    except ImportError:  # built with real (random) weights, then replaced
        yield
        return
    with init_empty_weights():
        yield


def _skeleton(folder: Path, model_class) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(folder)
    # the packed layers are ours: transformers must not set up its own quantizer
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cls = model_class or AutoModelForCausalLM
    with _empty_weights():
        return cls.from_config(cfg)


def _packed_linear(ck: Checkpoint, fqn: str, mod: nn.Linear, method, requantize, used):
    """The quantrs module for linear ``fqn`` when its tensors are packed, else None;
    adds the checkpoint tensors it consumed to ``used``."""
    parts = [n for n in ck.names() if n.startswith(fqn + ".")] if fqn else []
    if f"{fqn}.qweight" in ck:
        if method not in ("gptq", "awq"):
            raise UnsupportedFormatError(
                f"layer {fqn!r}: packed '.qweight' tensors but quant_method is "
                f"{method or 'unset'!r} (gptq or awq expected)"
            )
        read = read_gptq if method == "gptq" else read_awq
        imp = read(ck, fqn, requantize)
        weight, bias = imp.qweight, imp.bias
    elif own_entry(ck, f"{fqn}.weight") is not None:
        weight = read_own(ck, f"{fqn}.weight", ALL_FORMATS)
        bias = ck.float32(f"{fqn}.bias") if f"{fqn}.bias" in ck else None
    elif f"{fqn}.weight" in ck and ck.info(f"{fqn}.weight").dtype == "F8_E4M3":
        weight, bias = read_fp8(ck, fqn, requantize), None
    else:
        return None
    used.update(parts)
    new = _module_for(fqn, weight, bias)
    if (new.in_features, new.out_features) != (mod.in_features, mod.out_features):
        raise CorruptCheckpointError(
            f"layer {fqn!r}: the checkpoint's weight is [{new.out_features}, "
            f"{new.in_features}], the model's config wants [{mod.out_features}, {mod.in_features}]"
        )
    return new


def _module_for(fqn: str, weight, bias: np.ndarray | None) -> nn.Module:
    """The PyTorch module over one packed weight (the layer classes of quantrs.torch)."""
    if isinstance(weight, PerTensorFP8Linear):
        out_f, in_f = weight.weight_shape
        b = weight.bias
        m = FP8Linear(in_f, out_f, b is not None, weight.activation_scale)
        m.weight.copy_(torch.from_numpy(np.array(weight.weight)))
        m.weight_scale_inv.fill_(weight.weight_scale_inv)
        if b is not None:
            m.bias.copy_(torch.from_numpy(np.array(b, np.float32)))
        return m
    tbias = None if bias is None else torch.from_numpy(np.array(bias, np.float32))
    if isinstance(weight, QuantizedWeight):
        m = Int4Linear(weight.in_feat, weight.out_feat, tbias is not None, weight.group_size)
        m.qweight.copy_(torch.from_numpy(np.array(weight.data)))
        m.scales.copy_(torch.from_numpy(np.array(weight.scales)))
        if tbias is not None:
            m.bias.copy_(tbias)
        return m
    if isinstance(weight, IntZpWeight) or hasattr(weight, "dequantize_rows"):
        return GgufLinear(weight, tbias)
    raise UnsupportedFormatError(f"layer {fqn!r}: no module for {type(weight).__name__}")


def _dequantized(ck: Checkpoint, name: str) -> torch.Tensor:
    """The float32 ``[out, in]`` values of packed weight ``name`` (exact decoding)."""
    w = read_own(ck, name, ALL_FORMATS)
    if isinstance(w, QuantizedWeight):  # stored [in, out]
        return torch.from_numpy(np.ascontiguousarray(np.asarray(w.dequantize()).T))
    return torch.from_numpy(np.asarray(w.dequantize()))


def _assign_rest(model: nn.Module, ck: Checkpoint, used: set[str]) -> None:
    """Every checkpoint tensor not consumed by a packed layer becomes the model's
    parameter or buffer of that name (float tensors as the model's dtype); the tied
    head follows the embedding; a parameter left empty is an error naming it."""
    own = dict(model.named_parameters(remove_duplicate=False))
    own.update(dict(model.named_buffers()))
    ignore = [
        re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []
    ]
    state, unknown = {}, []
    for name in ck.names():
        base = name.rsplit(".", 1)[0]
        if name not in used and base in own and own_entry(ck, base) is not None:
            # a packed tensor that is no linear (a GGUF embedding table): its float values
            state[base] = _dequantized(ck, base).to(own[base].dtype)
            used.update(n for n in ck.names() if n.startswith(base + "."))
    for name in ck.names():
        if name in used or name in state:
            continue
        if name not in own:
            if not any(r.search(name) for r in ignore):
                unknown.append(name)
            continue
        t = ck.info(name)
        if t.dtype in ("F32", "F16", "BF16"):
            arr = ck.float32(name)
            state[name] = torch.from_numpy(arr).to(own[name].dtype)
        else:
            state[name] = torch.from_numpy(ck.array(name))
        if tuple(state[name].shape) != tuple(own[name].shape):
            raise CorruptCheckpointError(
                f"tensor {name!r}: shape {list(t.shape)}, the model wants {list(own[name].shape)}"
            )
    if unknown:
        raise UnsupportedFormatError(
            f"{ck.path}: tensors the model has no place for: {', '.join(unknown[:5])}"
            + (f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else "")
        )
    model.load_state_dict(state, strict=False, assign=True)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    empty = [n for n, p in model.named_parameters() if p.is_meta]
    if empty:
        raise CorruptCheckpointError(
            f"{ck.path}: no tensor for {', '.join(empty[:5])}"
            + (f" (and {len(empty) - 5} more)" if len(empty) > 5 else "")
        )
