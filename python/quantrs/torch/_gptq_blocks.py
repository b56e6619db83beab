"""GPTQ over a model, block by block (docs/int4.md "GPTQ"): the linears of one block
get their Hessians from inputs that went through the blocks before it already quantized,
as in the paper (Frantar et al. 2022, section 4, "sequential" quantization).

Blocks are the linears' name prefixes up to the first index (``model.layers.3``). When
those prefixes are the consecutive entries of one ``nn.ModuleList`` (transformers'
decoder layers), each block's inputs are captured once at the first block (the forward
stopped there) and carried through the blocks one at a time, so the whole model runs
once; otherwise every block reruns the whole model on the calibration batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from .._gptq import damped, gptq_factored, inverse_cholesky
from ._calibrate import record, recording, run

DAMP = 0.01  # dampening: 1 % of the mean diagonal of H (the paper's default)
# Least-squares refits of the group parameters after each layer's sweep (docs/int4.md
# "GPTQ"): the best measured on the real model.
REFINE = 1

# A transformers decoder layer appends to the KV cache it is given: a block run twice on
# the same inputs (recorded, then quantized) must get none.
_NO_CACHE = {"use_cache": False}


def _without_cache(kwargs: dict) -> dict:
    return {
        k: None if type(v).__name__.endswith("Cache") else _NO_CACHE.get(k, v)
        for k, v in kwargs.items()
    }


class _Stop(Exception):
    """Ends a forward at the first block once its inputs are captured."""


def blocks(names: Iterable[str]) -> dict[str, list[str]]:
    """The names grouped by block prefix: up to the first all-digit path part
    (``model.layers.3.mlp.up_proj`` -> ``model.layers.3``), in first-seen order; a name
    without one is a block of its own."""
    out: dict[str, list[str]] = {}
    for n in names:
        m = re.match(r"^(.*?(?:^|\.)\d+)(?:\.|$)", n)
        out.setdefault(m.group(1) if m else n, []).append(n)
    return out


def _chain(model: nn.Module, prefixes: list[str]) -> list[nn.Module] | None:
    """The blocks as modules when they are entries ``k, k+1, ...`` of one
    ``nn.ModuleList`` in that order; None otherwise."""
    parents = {p.rpartition(".")[0] for p in prefixes}
    if len(parents) != 1:
        return None
    parent = model.get_submodule(parents.pop()) if "." in prefixes[0] else model
    idx = [p.rpartition(".")[2] for p in prefixes]
    if not isinstance(parent, nn.ModuleList) or not all(i.isdigit() for i in idx):
        return None
    ks = [int(i) for i in idx]
    if ks != list(range(ks[0], ks[0] + len(ks))):
        return None
    return [parent[k] for k in ks]


@torch.no_grad()
def _first_inputs(model: nn.Module, first: nn.Module, batches: list[object]) -> list | None:
    """Each batch's ``(args, kwargs)`` at ``first``'s forward; None if a batch never
    reached it."""
    caught: list[tuple[tuple, dict]] = []

    def pre(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        caught.append((args, _without_cache(kwargs)))
        raise _Stop

    handle = first.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        for b in batches:
            try:
                run(model, b)
            except _Stop:
                continue
    finally:
        handle.remove()
    return caught if len(caught) == len(batches) else None


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
    sequential: bool = True,
    refine: int = REFINE,
    damp: float = DAMP,
) -> dict[str, object]:
    """GPTQ-quantize each of ``linears`` (name -> module) into ``format`` with the
    Hessians of ``batches``, block by block; the quantized values stand in the linears'
    weights while later blocks calibrate, and the weights are restored at the end.
    ``sequential=False``: every Hessian from one pass of the float model; ``refine``:
    least-squares refits of the group parameters and ``damp`` the dampening
    (``quantrs.gptq``'s). Returns
    name -> the packed weight (``QuantizedWeight`` or ``Int4AsymWeight``)."""
    groups = blocks(linears) if sequential else {"": list(linears)}
    chain = _chain(model, list(groups)) if sequential else None
    inputs = _first_inputs(model, chain[0], batches) if chain else None
    originals = {n: m.weight.data for n, m in linears.items()}
    packed: dict[str, object] = {}
    try:
        for k, names in enumerate(groups.values()):
            picked = {n: linears[n] for n in names}
            if inputs is None:
                stats = record(model, batches, picked, xtx=True)
            else:
                with recording(picked, xtx=True) as stats:
                    for args, kw in inputs:
                        chain[k](*args, **kw)
            how = (format, group_size, grid, act_order, refine)
            _quantize_block(picked, stats, packed, how, damp)
            if inputs is not None and k + 1 < len(chain):
                inputs = [_next_inputs(chain[k](*a, **kw), a, kw) for a, kw in inputs]
    finally:
        for n, m in linears.items():
            m.weight.data = originals[n]
    return packed


def _next_inputs(out: object, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The next block's ``(args, kwargs)``: this block's hidden states (its output, or
    the output's first element) in place of its own, the rest unchanged."""
    hidden = out[0] if isinstance(out, (tuple, list)) else out
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _quantize_block(picked, stats, packed, how, damp: float) -> None:
    """GPTQ on each linear of one block; linears with the same inputs (equal ``X^T X``)
    share the factor of ``H^-1``. The quantized values replace the weights."""
    factors: list[tuple[torch.Tensor, tuple[np.ndarray, np.ndarray]]] = []
    for n, m in picked.items():
        xtx = stats[n].xtx
        factor = next((f for x, f in factors if torch.equal(x, xtx)), None)
        if factor is None:
            hd = damped(2 * xtx.numpy(), damp)
            factor = (inverse_cholesky(hd), hd)
            factors.append((xtx, factor))
        w = m.weight.detach().to("cpu", torch.float64).numpy()
        q = gptq_factored(w, *factor, 2 * np.diag(xtx.numpy()), how)
        packed[n] = q
        deq = q.dequantize().T if how[0] == "int4" else q.dequantize()
        m.weight.data = torch.from_numpy(np.ascontiguousarray(deq)).to(
            m.weight.device, m.weight.dtype
        )
