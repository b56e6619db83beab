"""Calibration: run batches through a model and record, for each picked ``nn.Linear``,
what quantizers need from its inputs (docs/torch.md "Calibration"):

- the sum of ``x^2`` per input (the importance matrix of ``method="search"``),
- the largest ``|x|`` (static activation scales: FP8 W8A8's ``absmax / 448``),
- optionally ``X^T X`` (GPTQ's Hessian, ``H = 2 X^T X``).

One set of forward pre-hooks records all of them in a single pass. GPTQ goes block by
block (:func:`gptq_weights`): the linears of one block see the outputs of the blocks
before it already quantized, as in the paper.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .. import _core
from .._gptq import gptq

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


@torch.no_grad()
def record(
    model: nn.Module,
    batches: Iterable[object],
    linears: dict[str, nn.Module],
    *,
    xtx: bool = False,
) -> dict[str, InputStats]:
    """Run every batch through ``model`` and return each of ``linears``' (name -> module)
    input statistics; ``xtx`` adds the float64 ``X^T X``."""
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
        for batch in batches:
            run(model, batch)
    finally:
        for h in handles:
            h.remove()
    if linears and not any(s.rows for s in stats.values()):
        raise _core.InvalidArgument("calibration: expected at least one batch, got none")
    return stats


def fp8_activation_scales(stats: dict[str, InputStats]) -> dict[str, float]:
    """Each layer's static E4M3 activation scale, ``absmax / 448`` of its calibration
    inputs (the largest input lands on E4M3's largest value; docs/fp8.md). A layer whose
    inputs were all zero (or that never ran) gets 1.0, any positive value being exact."""
    return {n: (s.absmax / FP8_MAX if s.absmax > 0 else 1.0) for n, s in stats.items()}


def blocks(names: Iterable[str]) -> list[list[str]]:
    """The names grouped by block: up to the first all-digit path part
    (``model.layers.3.mlp.up_proj`` -> ``model.layers.3``), in first-seen order; names
    without one are a block each."""
    out: dict[str, list[str]] = {}
    for n in names:
        m = re.match(r"^(.*?(?:^|\.)\d+)(?:\.|$)", n)
        out.setdefault(m.group(1) if m else n, []).append(n)
    return list(out.values())


@torch.no_grad()
def gptq_weights(
    model: nn.Module,
    linears: dict[str, nn.Linear],
    batches: list[object],
    *,
    format: str,
    group_size: int,
    grid: str,
    act_order: bool = False,
) -> dict[str, object]:
    """GPTQ-quantize each of ``linears`` (name -> module) into ``format`` with the
    Hessians of ``batches``, block by block (:func:`blocks`): each block's inputs come
    from the earlier blocks already quantized (their weights are set to the quantized
    values during calibration and restored at the end). Returns name -> the packed
    weight (``QuantizedWeight`` or ``Int4AsymWeight``)."""
    originals = {n: m.weight.data for n, m in linears.items()}
    packed: dict[str, object] = {}
    try:
        for names in blocks(linears):
            stats = record(model, batches, {n: linears[n] for n in names}, xtx=True)
            for n in names:
                m = linears[n]
                w = m.weight.detach().to("cpu", torch.float64).numpy()
                xtx = stats[n].xtx
                assert xtx is not None
                q = gptq(
                    w,
                    2 * xtx.numpy(),
                    format=format,
                    group_size=group_size,
                    grid=grid,
                    act_order=act_order,
                )
                packed[n] = q
                deq = q.dequantize().T if format == "int4" else q.dequantize()
                m.weight.data = torch.from_numpy(np.ascontiguousarray(deq)).to(
                    m.weight.device, m.weight.dtype
                )
    finally:
        for n, m in linears.items():
            m.weight.data = originals[n]
    return packed


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
    required), else one recording pass when ``calibration`` is given (FP8: per-layer
    activation scales; INT4: the importance)."""
    linears = {fqn_of[id(child)]: child for _, _, child in todo}
    if quantizer == "gptq":
        if method not in ("int4", "int4_asym"):
            raise _core.InvalidArgument(
                f"quantizer: 'gptq' applies to 'int4' and 'int4_asym', not {method!r}"
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
