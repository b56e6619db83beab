"""Importance of each input of a model's linears from calibration batches: the mean of
``x^2`` per input feature (llama.cpp's imatrix), which ``quantize_(..., calibration=...)``
and ``QuantizedWeight.quantize(..., method="search", importance=...)`` use to weight the
quantization error (docs/int4.md "Quantizers")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import numpy as np
import torch
from torch import nn

from .. import _core


@torch.no_grad()
def collect_importance(
    model: nn.Module,
    batches: Iterable[object],
    filter_fn: Callable[[nn.Module, str], bool],
) -> dict[str, np.ndarray]:
    """Run ``model(batch)`` (``model(*batch)`` for a tuple or list, ``model(**batch)``
    for a dict) on each batch and return, for every ``nn.Linear`` that ``filter_fn``
    picks, its inputs' mean ``x^2`` (float32 ``[in_features]``) keyed by module name."""
    picked = {
        n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and filter_fn(m, n)
    }
    sums = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in picked.items()}
    rows = dict.fromkeys(picked, 0)

    def hook(name: str):
        def pre(_module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to("cpu", torch.float64)
            sums[name] += (x * x).sum(0)
            rows[name] += x.shape[0]

        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in picked.items()]
    try:
        for batch in batches:
            if isinstance(batch, dict):
                model(**batch)
            elif isinstance(batch, (tuple, list)):
                model(*batch)
            else:
                model(batch)
    finally:
        for h in handles:
            h.remove()
    if picked and not any(rows.values()):
        raise _core.InvalidArgument("calibration: expected at least one batch, got none")
    return {n: (sums[n] / max(rows[n], 1)).float().numpy() for n in picked}
