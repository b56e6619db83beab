"""Static FP8 E4M3 activation fake quantization for W8A8 QAT (docs/torch.md "QAT to
deployment").

``prepare_w8a8(model)`` gives each chosen ``nn.Linear`` a child ``input_fake_quant``
(:class:`FP8ActivationFakeQuant`) and a forward pre-hook through it. In training mode the
module calibrates its static scale from the inputs it sees (``scale = running absmax /
448``, the rule ``quantrs.PerTensorFP8Linear`` serves with); in eval mode the scale is
frozen. The input is replaced by ``decode(encode(x / scale, saturate)) * scale`` -- the
extension's own E4M3 codec, the rounding ``PerTensorFP8Linear``'s W8A8 forward applies --
with a straight-through gradient (identity inside the grid's range, as the clamp of the
saturating cast lets every calibrated input through). :func:`convert_qat` hands the scale
to ``FP8Linear(activation_scale=...)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from .. import _core

_E4M3_MAX = 448.0


class FP8ActivationFakeQuant(nn.Module):
    """Fake-quantizes its input onto the E4M3 grid with one static scale (buffer
    ``scale``: 0 until the first calibrating forward)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise TypeError(
                f"FP8ActivationFakeQuant: expected a float32 CPU tensor, got {x.dtype} on "
                f"{x.device}"
            )
        if self.training:
            with torch.no_grad():
                s = float(x.detach().abs().max()) / _E4M3_MAX
                if s > float(self.scale):
                    self.scale.fill_(s)
        s = float(self.scale)
        if s <= 0.0:
            raise _core.InvalidState(
                "FP8ActivationFakeQuant: the activation scale is not calibrated (run a "
                "forward in training mode first)"
            )
        return x + (fake_quantize_e4m3(x.detach(), s) - x).detach()


def fake_quantize_e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``decode(encode(x / scale, saturate=True)) * scale`` in float32 (the division a true
    float32 division, as the serving layer's)."""
    s = np.float32(scale)
    y = np.ascontiguousarray(x.numpy(), np.float32) / s
    codes = _core.fp8_encode(y, "e4m3", saturate=True)
    return torch.from_numpy(_core.fp8_decode(codes, "e4m3") * s)


def _hook(module: nn.Module, args: tuple) -> tuple:
    return (module.input_fake_quant(args[0]), *args[1:])


def prepare_w8a8(
    model: nn.Module, filter_fn: Callable[[nn.Module, str], bool] | None = None
) -> nn.Module:
    """Adds :class:`FP8ActivationFakeQuant` in front of every ``nn.Linear`` of ``model``
    (those ``filter_fn(module, fqn)`` accepts); returns ``model``."""
    for fqn, m in model.named_modules():
        if type(m) is not nn.Linear or hasattr(m, "input_fake_quant"):
            continue
        if filter_fn is not None and not filter_fn(m, fqn):
            continue
        m.add_module("input_fake_quant", FP8ActivationFakeQuant())
        m.register_forward_pre_hook(_hook)
    return model
