"""Importance of each input of a model's linears from calibration batches: the mean of
``x^2`` per input feature (llama.cpp's imatrix), which ``quantize_(..., calibration=...)``
and ``QuantizedWeight.quantize(..., method="search", importance=...)`` use to weight the
quantization error (docs/int4.md "Quantizers"). The recording is ``_calibrate``'s."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import numpy as np
from torch import nn

from ._calibrate import as_batches, record


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
    stats = record(model, as_batches(batches), picked)
    return {n: s.importance() for n, s in stats.items()}


def collect_activation_ranges(
    model: nn.Module,
    batches: Iterable[object],
    filter_fn: Callable[[nn.Module, str], bool],
) -> dict[str, float]:
    """Each picked ``nn.Linear``'s largest input magnitude ``max |x|`` over the
    calibration batches, keyed by module name: the static range of a W8A8 layer's
    activations (FP8: ``activation_scale = absmax / 448``; int8: ``absmax / 127``)."""
    picked = {
        n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and filter_fn(m, n)
    }
    stats = record(model, as_batches(batches), picked)
    return {n: s.absmax for n, s in stats.items()}
