"""GGUF block weights inside PyTorch: :class:`GgufLinear` (an inference ``nn.Module``
over GGUF blocks held in its ``qweight`` buffer) and :func:`load_gguf_llama`, a
transformers Llama model whose block-quantized linears run from the file's packed tensors
(docs/formats.md, docs/torch.md)."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import GgufWeight, Int4AsymWeight, Int4KWeight, IntZpWeight, _core
from ..formats.gguf import PACKED_TYPES, GgufFile, packed_weight
from . import _gguf_op, _packed_state
from ._gguf_model import (
    GGUF_ARCHITECTURES,
    gguf_architecture,
    llama_row_order,
    row_order,
    tensor_map,
)
from ._layer_io import _needs_graph, check_features, drop_views, serve

__all__ = ["GgufLinear", "load_gguf_llama", "llama_row_order", "GGUF_ARCHITECTURES"]

_BUFFERS = ("qweight", "bias")


def q4_1_blocks(weight: Int4AsymWeight) -> np.ndarray:
    """An ``int4_asym`` weight of group 32 as Q4_1 blocks ``[out, in / 32 * 20]`` uint8:
    the same values bit for bit (``d * q + m`` with half ``d`` and ``m``, Q4_1's nibble
    order; docs/int4.md "Asymmetric INT4") and the same bytes."""
    codes = weight.codes()
    out_f, in_f = codes.shape
    runs = codes.reshape(out_f, in_f // 32, 2, 16)
    nibbles = runs[:, :, 0, :] | (runs[:, :, 1, :] << 4)
    halves = weight.scales().astype("<f2").view(np.uint8)
    return np.concatenate([halves, nibbles], axis=2).reshape(out_f, -1)


def _blocks_of(weight, out_index) -> tuple[str, np.ndarray] | None:
    """``(ggml type, [out, bytes per row] uint8)`` for a weight with a GGUF block form
    (rows already in ``out_index`` order), None for the others."""
    if isinstance(weight, GgufWeight):
        rows = weight.to_bytes().reshape(weight.shape[0], -1)
        return weight.type, rows if out_index is None else np.ascontiguousarray(rows[out_index])
    if isinstance(weight, Int4AsymWeight) and weight.group_size == 32 and out_index is None:
        return "q4_1", q4_1_blocks(weight)
    return None


class GgufLinear(nn.Module):
    """``y = x @ W.T + bias`` with ``W`` packed: a :class:`quantrs.GgufWeight`, an
    :class:`quantrs.Int4AsymWeight` (what ``quantize_(model, "int4_asym")`` makes), an
    :class:`quantrs.Int4KWeight` (``quantize_(model, "int4_k")``) or an
    :class:`quantrs.IntZpWeight` (what ``read_gptq`` / ``read_awq`` give for zero points).

    GGUF blocks (and ``int4_asym`` of group 32, which is Q4_1 bit for bit) live in the
    ``qweight`` buffer (uint8 ``[out, bytes per row]``, the ggml type in ``weight_type``):
    the kernel reads it in place, ``state_dict`` holds the bytes and ``load_state_dict``
    writes are seen, and the forward is the custom operator ``quantrs::gguf_linear``
    (``torch.compile`` / ``torch.export`` see one node). Other weights stay in
    ``weight_packed`` (``qweight`` is None, the weight held once in the Rust object) and
    run through ``quantrs::packed_linear``; ``state_dict`` exports their parts
    (:mod:`._packed_state`), ``load_state_dict`` rebuilds them, and pickling carries
    them. ``x``'s dtype is kept (float32, bfloat16, float16). The weight and the bias
    are frozen; an input that requires grad gets ``grad_output @ W`` (the weight
    decoded a band of rows at a time), so LoRA adapters train on top (QLoRA,
    :func:`quantrs.torch.peft_config`).
    ``out_index`` reorders the output features (``y[..., out_index]``): llama.cpp stores
    Llama's q / k projections with their rows permuted (block rows are reordered once)."""

    def __init__(
        self,
        weight: GgufWeight | Int4AsymWeight | Int4KWeight | IntZpWeight,
        bias: torch.Tensor | None = None,
        out_index: np.ndarray | None = None,
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        order = None if out_index is None else np.asarray(out_index, dtype=np.int64)
        blocks = _blocks_of(weight, order)
        self.weight_type = None if blocks is None else blocks[0]
        self._packed = weight if blocks is None else None
        self.register_buffer("qweight", None if blocks is None else torch.from_numpy(blocks[1]))
        self.register_buffer(
            "bias", None if bias is None else bias.detach().to("cpu", torch.float32).clone()
        )
        kept = None if blocks is not None or order is None else torch.from_numpy(order)
        self.register_buffer("out_index", kept)
        self._register()

    def _register(self) -> None:
        """A key of the packed-weight table for ``quantrs::packed_linear`` (weights
        without a GGUF block form), dropped when the module goes."""
        self._key = None
        if self._packed is not None:
            self._key = _gguf_op.register_packed(self._packed)
            weakref.finalize(self, _gguf_op.release_packed, self._key)

    @property
    def weight_packed(self) -> GgufWeight | Int4AsymWeight | Int4KWeight | IntZpWeight:
        """The packed weight as a ``quantrs`` object (for the buffer-held blocks a
        ``GgufWeight`` copied from ``qweight``)."""
        if self.qweight is None:
            return self._packed
        return _gguf_op.gguf_weight(self.qweight, self.weight_type, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:  # an instance attribute: no nn.Module lookup
            return self._object_forward(x)
        y = serve(self, x)
        if y is not None:
            return y
        check_features("GgufLinear", x, self.in_features)
        if x.device.type != "cpu":  # the kernel runs on the CPU; the result goes back
            return self.forward(x.cpu()).to(x.device)
        args = (x, self.qweight, self.bias, self.weight_type, self.in_features)
        if _needs_graph(x, self.bias):
            return _gguf_op.gguf_linear(*args)
        return _gguf_op.gguf_linear_impl(*args)

    def _serving(self) -> tuple:
        return _BUFFERS, self._args_of, _core.gguf_linear, None

    def _args_of(self, qweight, bias) -> tuple:
        return _gguf_op.gguf_args(qweight, bias, self.weight_type, self.in_features)

    def _object_forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features("GgufLinear", x, self.in_features)
        if x.device.type != "cpu":  # the kernel runs on the CPU; the result goes back
            return self._object_forward(x.cpu()).to(x.device)
        args = (x, self.bias, self.out_index, self._key, self.out_features)
        if _needs_graph(x, self.bias):
            return _gguf_op.packed_linear(*args)
        return _gguf_op.packed_linear_impl(*args)

    @property
    def weight(self) -> torch.Tensor:
        """A float32 copy of the weight ``[out, in]``, built on each access (the layer
        itself computes from the packed bytes); libraries that read a base layer's
        ``weight.device`` / ``dtype``, as peft does when it wraps one, find it here."""
        return self.dequantize()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` the layer computes with (rows in
        ``out_index`` order)."""
        w = torch.from_numpy(self.weight_packed.dequantize())
        return w if self.out_index is None else w[self.out_index]

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._packed is not None:  # the Rust object's parts, made for the export
            for name, a in _packed_state.parts_of(self._packed).items():
                destination[prefix + name] = torch.from_numpy(a)

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
    ) -> None:
        if self._packed is not None:
            # Pops its entries, so that torch does not count them as unexpected.
            weight = _packed_state.load_parts(self._packed, state_dict, prefix, missing_keys)
            if weight is not None:
                self._packed = weight
                key, self._key = self._key, _gguf_op.register_packed(weight)
                _gguf_op.release_packed(key)
                weakref.finalize(self, _gguf_op.release_packed, self._key)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors
        )

    def __getstate__(self) -> dict:
        state = drop_views(self.__dict__)
        state.pop("_key", None)
        packed = state.pop("_packed", None)
        # The Rust object does not pickle: its layout and parts do.
        state["_packed_parts"] = None if packed is None else _packed_state.pickled(packed)
        return state

    def __setstate__(self, state: dict) -> None:
        # Unpickled and deep-copied modules get their own key (the original's goes with it).
        state = dict(state)
        parts = state.pop("_packed_parts", None)
        state["_packed"] = None if parts is None else _packed_state.unpickled(parts)
        super().__setstate__(state)
        self._register()

    def extra_repr(self) -> str:
        kind = self.weight_type if self.qweight is not None else self._packed.type
        return (
            f"type={kind}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


def load_gguf_llama(path: str | os.PathLike, **kwargs) -> nn.Module:
    """A transformers causal LM from a GGUF file (architectures
    :data:`GGUF_ARCHITECTURES`: llama, which llama.cpp also writes for Mistral, qwen2,
    qwen3), each linear whose tensor has a block type
    (:data:`quantrs.formats.gguf.PACKED_TYPES`) replaced by :class:`GgufLinear` over the
    file's packed tensor (read from the memory-mapped file, no float copy kept; q / k
    rows in transformers' order); the rest (embeddings, norms, float linears) as
    transformers loads it. The tensor names are transformers' GGUF mapping.
    ``kwargs`` go to ``from_pretrained``."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    with GgufFile(p) as g:
        arch = gguf_architecture(g)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, **kwargs)
    tied = getattr(model.config, "tie_word_embeddings", False)
    names = tensor_map(model, arch)
    with GgufFile(p) as g:
        for t in g.tensors.values():
            if t.type_name not in PACKED_TYPES or len(t.dims) != 2 or t.name not in names:
                continue
            hf_name, heads = names[t.name]
            fqn = hf_name.removesuffix(".weight")
            if fqn == hf_name or (tied and fqn == "lm_head"):
                continue
            old = model.get_submodule(fqn)
            if not isinstance(old, nn.Linear):  # the embedding: transformers' float table
                continue
            w = packed_weight(g, t)
            model.set_submodule(fqn, GgufLinear(w, old.bias, row_order(w.shape[0], heads)))
    return model
