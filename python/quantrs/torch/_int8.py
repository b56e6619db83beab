"""``Int8Linear``: the torch module over ``quantrs.Int8Linear`` (int8 codes ``[out, in]``,
one ``absmax / 127`` float32 scale per output channel), the serving layer of
``QatAdamW(target="int8", grid="deploy")`` and a ``quantize_`` / QLoRA target.

CPU only (quantrs has no INT8 device kernel). The forward is the custom operator
``quantrs::int8_linear`` (``_ops``): float32, bfloat16, float16 or float64 activations of
any leading batch shape, the input's dtype out, the input's gradient ``grad_output @ W``
through the layer's transposed kernel; the codes and scales are frozen.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .. import _core
from . import _ops
from ._layer_io import _needs_graph, _route, _weight_of, drop_views, serve

_BUFFERS = ("weight", "scales", "bias")


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with ``W = weight * scales[:, None]``, ``weight`` int8 codes in
    ``[-127, 127]`` (``quantrs.Int8Linear``).

    Buffers: ``weight`` (int8 ``[out, in]``), ``scales`` (float32 ``[out]``), ``bias``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantizes ``linear``'s weight per output channel (``quantrs.Int8Linear.from_float``)."""
        w, b = _weight_of("Int8Linear", linear)
        if linear.weight.device.type != "cpu":
            raise _core.UnsupportedOperation(
                f"Int8Linear.from_linear: runs on the CPU, got a weight on {linear.weight.device}"
            )
        layer = _core.Int8Linear.from_float(w.contiguous().numpy())
        m = cls(linear.in_features, linear.out_features, b is not None)
        m.weight.copy_(torch.from_numpy(np.array(layer.q)))
        m.scales.copy_(torch.from_numpy(np.array(layer.scales)))
        if b is not None:
            m.bias.copy_(b)
        return m

    def layer(self) -> _core.Int8Linear:
        """The ``quantrs.Int8Linear`` for the current buffers (the bias added outside)."""
        return _ops.int8_layer(self.weight, self.scales)

    def dequantize(self) -> torch.Tensor:
        """The weight as the kernel sees it, float32 ``[out_features, in_features]``."""
        return torch.from_numpy(np.asarray(self.layer().dequantize_w(), np.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = serve(self, x)
        if y is not None:
            return y
        x2 = _route("Int8Linear", x, self.in_features)
        if x2 is not None and x2.device.type != "cpu":
            raise _core.UnsupportedOperation(
                f"Int8Linear: runs on the CPU, got an input on {x.device}"
            )
        args = (x, self.weight, self.scales, self.bias)
        if _needs_graph(x, self.bias):
            return _ops.int8_linear(*args)
        return _ops.int8_linear_impl(*args)

    def _serving(self) -> tuple:
        return _BUFFERS, _ops.int8_args, _core.int8_linear, None

    def __getstate__(self) -> dict:
        return drop_views(self.__dict__)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )
