"""What calibration gives ``quantize_`` (docs/torch.md "Calibration"): per layer, the
importance for ``quantizer="search"``, the GPTQ-packed weight for ``quantizer="gptq"``,
or the FP8 activation scale; and the ``Int4Linear`` built from a packed weight."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .. import _core
from ._calibrate import as_batches, fp8_activation_scales, record
from ._gptq_blocks import gptq_weights


def load_int4(empty: nn.Module, qw: _core.QuantizedWeight, linear: nn.Linear) -> nn.Module:
    """``empty`` (a bias-free ``Int4Linear`` of ``linear``'s shape and group size) holding
    ``qw`` and ``linear``'s bias, on ``linear``'s device."""
    empty.qweight.copy_(torch.from_numpy(np.array(qw.data)))
    empty.scales.copy_(torch.from_numpy(np.array(qw.scales)))
    if linear.bias is not None:
        empty.register_buffer("bias", linear.bias.detach().to("cpu", torch.float32).clone())
    return empty.to(linear.weight.device)


@dataclass
class Plan:
    """What calibration gives ``quantize_``, per layer name: the importance (mean
    ``x^2``) for ``"search"``, the GPTQ-packed weights, the FP8 activation scales."""

    importance: dict[str, np.ndarray] = field(default_factory=dict)
    packed: dict[str, object] = field(default_factory=dict)
    act_scales: dict[str, float] = field(default_factory=dict)


def plan(
    model: nn.Module,
    method: str,
    quantizer: str | None,
    group_size: int,
    calibration: Iterable[object] | None,
    fqn_of: dict[int, str],
    todo: list[tuple[nn.Module, str, nn.Module]],
) -> Plan:
    """Run ``quantize_``'s calibration: GPTQ for ``quantizer="gptq"`` (calibration
    required; the INT4 default when ``calibration`` is given), else one recording pass
    when ``calibration`` is given (FP8: per-layer activation scales; INT4 "search" and
    the GGUF types: the importance)."""
    linears = {fqn_of[id(child)]: child for _, _, child in todo}
    if quantizer is None and calibration is not None and method in ("int4", "int4_asym"):
        quantizer = "gptq"  # the best measured with calibration text (docs/int4.md "GPTQ")
    if quantizer == "gptq":
        if method not in ("int4", "int4_asym", "int4_k"):
            raise _core.InvalidArgument(
                f"quantizer: 'gptq' applies to 'int4', 'int4_asym' and 'int4_k', not {method!r}"
            )
        if calibration is None:
            raise _core.InvalidArgument(
                "calibration: quantizer='gptq' needs calibration batches (its Hessians)"
            )
        batches = as_batches(calibration)
        fmt = dict(format=method, group_size=group_size, grid="search")
        return Plan(packed=gptq_weights(model, linears, batches, **fmt))
    if calibration is None:
        return Plan()
    stats = record(model, as_batches(calibration), linears)
    if method == "fp8":
        return Plan(act_scales=fp8_activation_scales(stats))
    return Plan(importance={n: s.importance() for n, s in stats.items()})
