"""Calibration: run batches through a model and record, for each picked ``nn.Linear``,
what quantizers need from its inputs (docs/torch.md "Calibration"), with one set of
forward pre-hooks:

- the sum of ``x^2`` per input (the importance matrix of ``method="search"``),
- the largest ``|x|`` (static activation scales: FP8 W8A8's ``absmax / 448``),
- optionally ``X^T X`` (GPTQ's Hessian, ``H = 2 X^T X``; ``_gptq_blocks`` drives it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .. import _core

FP8_MAX = 448.0  # largest finite E4M3 value (docs/fp8.md)


@dataclass
class InputStats:
    """What one linear's calibration inputs ``x [rows, in]`` gave (float64 sums)."""

    sq_sum: torch.Tensor
    absmax: float = 0.0
    rows: int = 0
    xtx: torch.Tensor | None = field(default=None, repr=False)

    def importance(self) -> np.ndarray:
        """Mean ``x^2`` per input, float32 ``[in]``."""
        return (self.sq_sum / max(self.rows, 1)).float().numpy()


def as_batches(batches: Iterable[object] | None) -> list[object]:
    """``calibration`` as a list (GPTQ runs it once per block; a tensor is its batches
    along the first dimension); refuses None and empty."""
    if batches is None:
        raise _core.InvalidArgument("calibration: expected an iterable of batches, got None")
    if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
        raise TypeError(
            f"calibration: expected an iterable of batches (e.g. a list of input-id "
            f"tensors), got {type(batches).__name__}"
        )
    out = list(batches)
    if not out:
        raise _core.InvalidArgument("calibration: expected at least one batch, got none")
    return out


def run(model: nn.Module, batch: object) -> None:
    """``model(batch)``, ``model(*batch)`` for a tuple or list, ``model(**batch)`` for a
    dict."""
    if isinstance(batch, dict):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)


@contextmanager
def recording(linears: dict[str, nn.Module], *, xtx: bool = False) -> Iterator[dict]:
    """Forward pre-hooks on ``linears`` (name -> module) while the block runs: yields
    name -> :class:`InputStats`, filled by every forward inside it; ``xtx`` adds the
    float64 ``X^T X``."""
    stats = {
        n: InputStats(torch.zeros(m.in_features, dtype=torch.float64)) for n, m in linears.items()
    }
    if xtx:
        for n, m in linears.items():
            stats[n].xtx = torch.zeros(m.in_features, m.in_features, dtype=torch.float64)

    def hook(name: str):
        def pre(_module: nn.Module, args: tuple) -> None:
            x = args[0].detach()
            x = x.reshape(-1, x.shape[-1]).to("cpu", torch.float32)
            s = stats[name]
            s.sq_sum += (x.double() ** 2).sum(0)
            s.rows += x.shape[0]
            if x.numel():
                s.absmax = max(s.absmax, float(x.abs().max()))
            if s.xtx is not None:
                s.xtx += (x.T @ x).double()

        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in linears.items()]
    try:
        with torch.no_grad():
            yield stats
    finally:
        for h in handles:
            h.remove()
    if linears and not any(s.rows for s in stats.values()):
        raise _core.InvalidArgument("calibration: expected at least one batch, got none")


def record(
    model: nn.Module,
    batches: Iterable[object],
    linears: dict[str, nn.Module],
    *,
    xtx: bool = False,
) -> dict[str, InputStats]:
    """Run every batch through ``model`` and return each of ``linears``' (name -> module)
    input statistics (:func:`recording`)."""
    with recording(linears, xtx=xtx) as stats:
        for batch in batches:
            run(model, batch)
    return stats


def fp8_activation_scales(stats: dict[str, InputStats]) -> dict[str, float]:
    """Each layer's static E4M3 activation scale, ``absmax / 448`` of its calibration
    inputs (the largest input lands on E4M3's largest value; docs/fp8.md). A layer whose
    inputs were all zero (or that never ran) gets 1.0, any positive value being exact."""
    return {n: (s.absmax / FP8_MAX if s.absmax > 0 else 1.0) for n, s in stats.items()}
