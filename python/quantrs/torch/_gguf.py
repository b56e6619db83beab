"""GGUF block weights inside PyTorch: :class:`GgufLinear` (an inference ``nn.Module``
over a packed :class:`quantrs.GgufWeight`) and :func:`load_gguf_llama`, a transformers
Llama model whose block-quantized linears run from the file's packed tensors
(docs/formats.md, docs/torch.md)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import GgufWeight, Int4AsymWeight, IntZpWeight
from ..formats.gguf import PACKED_TYPES, GgufFile, packed_weight
from ._layer_io import check_features

# Floats per decoded tile of the input gradient (1 MiB): the packed weight is decoded a
# band of rows at a time, never whole.
_TILE_FLOATS = 1 << 18


class _PackedMatmul(torch.autograd.Function):
    """``x @ W.T`` for float32 CPU ``x [rows, in]`` over a packed weight; the backward
    gives ``x`` its gradient ``grad @ W``, decoding ``W`` in bands of rows
    (``dequantize_rows``) and accumulating each band's product in torch."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, packed) -> torch.Tensor:
        ctx.packed = packed
        return torch.from_numpy(packed.matmul(x.numpy()))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return packed_grad_input(ctx.packed, grad.contiguous()), None


def packed_grad_input(packed, grad: torch.Tensor) -> torch.Tensor:
    """``grad @ W`` for float32 ``grad [rows, out]`` and a packed ``W [out, in]``."""
    out_f, in_f = packed.shape
    dx = torch.zeros(grad.shape[0], in_f, dtype=torch.float32)
    band = max(1, _TILE_FLOATS // in_f)
    for r0 in range(0, out_f, band):
        r1 = min(out_f, r0 + band)
        dx.addmm_(grad[:, r0:r1], torch.from_numpy(packed.dequantize_rows(r0, r1)))
    return dx


class GgufLinear(nn.Module):
    """``y = x @ W.T + bias`` with ``W`` a packed :class:`quantrs.GgufWeight` (or a
    :class:`quantrs.Int4AsymWeight`, what ``quantize_(model, "int4_asym")`` makes, or a
    :class:`quantrs.IntZpWeight`, what ``read_gptq`` / ``read_awq`` give for zero points); the
    kernel runs on float32 CPU activations, ``x``'s dtype is restored. The packed weight
    and the bias are frozen; an input that requires grad gets ``grad_output @ W`` (the
    weight decoded a band of rows at a time), so LoRA adapters train on top (QLoRA,
    :func:`quantrs.torch.peft_config`). ``out_index`` reorders the output features
    (``y[..., out_index]``): llama.cpp stores Llama's q / k projections with their rows
    permuted."""

    def __init__(
        self,
        weight: GgufWeight | Int4AsymWeight | IntZpWeight,
        bias: torch.Tensor | None = None,
        out_index: np.ndarray | None = None,
    ):
        super().__init__()
        self.weight_packed = weight
        self.out_features, self.in_features = weight.shape
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        )
        self.register_buffer(
            "out_index", None if out_index is None else torch.as_tensor(out_index, dtype=torch.long)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_features("GgufLinear", x, self.in_features)
        x32 = x.to("cpu", torch.float32).reshape(-1, self.in_features).contiguous()
        if torch.is_grad_enabled() and x32.requires_grad:
            y = _PackedMatmul.apply(x32, self.weight_packed)
        else:
            y = torch.from_numpy(self.weight_packed.matmul(x32.detach().numpy()))
        y = y.reshape(*x.shape[:-1], self.out_features)
        if self.out_index is not None:
            y = y[..., self.out_index]
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.device, x.dtype)

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

    def extra_repr(self) -> str:
        return (
            f"type={self.weight_packed.type}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


# transformers' Llama module -> llama.cpp's tensor name (transformers' GGUF mapping).
_LLAMA_LINEARS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_row_order(out_features: int, n_head: int) -> np.ndarray:
    """Indices ``p`` with ``W_hf = W_file[p]`` for a q / k projection: the inverse of
    llama.cpp's per-head interleave of the rotary halves, as transformers undoes it."""
    dim = out_features // n_head // 2
    return np.arange(out_features).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(-1)


def load_gguf_llama(path: str | os.PathLike, **kwargs) -> nn.Module:
    """A transformers Llama causal LM from a GGUF file, its linears with a block type
    (:data:`quantrs.formats.gguf.PACKED_TYPES`) replaced by :class:`GgufLinear` over the
    file's packed tensors (read from the memory-mapped file, no float copy kept); the
    rest (embeddings, norms) as transformers loads it. ``kwargs`` go to
    ``from_pretrained``."""
    from transformers import AutoModelForCausalLM

    p = Path(path)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, **kwargs)
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    with GgufFile(p) as g:
        for i, layer in enumerate(model.model.layers):
            for hf, short in _LLAMA_LINEARS.items():
                name = f"blk.{i}.{short}.weight"
                t = g.tensors.get(name)
                if t is None or t.type_name not in PACKED_TYPES:
                    continue
                parent_name, attr = hf.split(".")
                parent = getattr(layer, parent_name)
                old = getattr(parent, attr)
                w = packed_weight(g, t)
                order = llama_row_order(w.shape[0], heads[short]) if short in heads else None
                setattr(parent, attr, GgufLinear(w, old.bias, order))
        out = g.tensors.get("output.weight")
        if out is not None and out.type_name in PACKED_TYPES and not cfg.tie_word_embeddings:
            model.lm_head = GgufLinear(packed_weight(g, out), model.lm_head.bias)
    return model
