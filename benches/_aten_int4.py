"""The stand-in for torchao's INT4 weight-only CPU row: torch's own
``aten._weight_int4pack_mm_for_cpu`` (the kernel torchao's CPU INT4 layout calls) over a
bfloat16 model, INT4 with a bfloat16 scale and zero per group of 32. torchao 0.18 has no CPU
INT4 path without its ``mslk`` extension or CUDA, so the bench calls the aten kernel
directly.

The quantization is the min/max asymmetric one of PyTorch's own tests of this kernel:
``q = round((w - min) / s)`` in 0..15, ``s = (max - min) / 15``, stored zero
``z = min + 8 s``; the kernel computes ``w = (q - 8) s + z``.
"""

from __future__ import annotations

import torch
from torch import nn


class AtenInt4Linear(nn.Module):
    """``y = x W^T + b`` for bfloat16 ``x`` through ``_weight_int4pack_mm_for_cpu``."""

    def __init__(self, linear: nn.Linear, group_size: int = 32) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        n, k = w.shape
        t = w.reshape(n, k // group_size, group_size)
        lo, hi = t.amin(-1, keepdim=True), t.amax(-1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-6) / 15
        q = ((t - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8 * scale
        sz = torch.cat([scale, zero], -1).to(torch.bfloat16).transpose(0, 1).contiguous()
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_and_zeros", sz)  # [k / group, n, 2]
        b = linear.bias
        self.register_buffer("bias", None if b is None else b.detach().to(torch.bfloat16))
        self.group_size, self.in_features, self.out_features = group_size, k, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x2, self.packed, self.group_size, self.scales_and_zeros
        )
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def quantize_aten_int4(model: nn.Module, group_size: int = 32) -> nn.Module:
    """``model`` in bfloat16 with every ``nn.Linear`` but the ``lm_head`` replaced by
    :class:`AtenInt4Linear` (the same layers ``quantrs.torch.quantize_`` replaces)."""
    model = model.to(torch.bfloat16)
    todo = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and name != "lm_head"
    ]
    for parent, name, child in todo:
        setattr(parent, name, AtenInt4Linear(child, group_size))
    return model
