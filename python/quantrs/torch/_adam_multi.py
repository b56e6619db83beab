"""One Rust call for every CPU parameter of ``AdamW4bit`` / ``Adam4bit``'s step.

``torch.optim.AdamW(fused=True)`` updates a whole group in one kernel call; this does the
same on the CPU: the parameters, gradients, engines and group settings go to
``_core.adam4bit_multi_step``, which validates every pair (the gradients' values included)
before it changes any, then runs every update under one release of the GIL, spread over
the threads by size. CUDA parameters keep their per-parameter device step.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from .. import _core
from . import _sharded
from ._checks import check_grad

_LOCATED = re.compile(r"^params\[(\d+)\]: ")


def update_all(opt: Any, work: list[tuple], hypers: dict[int, tuple]) -> None:
    """Update every ``(i, gi, group, p, g)`` of ``work`` (all checked by the caller)."""
    cpu = [item for item in work if item[3].device.type == "cpu"]
    if cpu:
        _cpu_step(opt, cpu, hypers)
    # Device parameters after the host call, which may still refuse the whole step.
    for item in work:
        if item[3].device.type != "cpu":
            opt._update(*item, hypers[item[1]])


def _cpu_step(opt: Any, cpu: list[tuple], hypers: dict[int, tuple]) -> None:
    # The hyper-parameters go to every engine in the call, not one setter call each.
    slots = [
        opt._slots.get(p) or opt._slot_for(i, gi, group, p, hypers[gi])
        for i, gi, group, p, _ in cpu
    ]
    # The float32 moments of 1-D DTensor parameters (_sharded.py) are stepped in Python:
    # their gradients are checked here, before the Rust call changes anything.
    f32 = [(s, item) for s, item in zip(slots, cpu) if isinstance(s, _sharded.F32Slot)]
    # One pass over all of them, in NumPy (torch hands more than 32 K elements to its
    # OpenMP pool, whose start costs more than the check); the slow path names the first
    # bad one.
    if f32 and not _all_finite([item[4] for _, item in f32]):
        for _, (i, *_, g) in f32:
            check_grad(opt._name, i, g, g)  # shape and device checked already: the values
    rust = [(s, item) for s, item in zip(slots, cpu) if s.engine is not None]
    views = [_views(opt, s, i, p, g) for s, (i, _, _, p, g) in rust]
    try:
        _core.adam4bit_multi_step(
            [s.engine for s, _ in rust],
            [v[0].numpy() for v in views],
            [v[1].numpy() for v in views],
            name="w",
            hyper=[hypers[gi] for _, (_, gi, *_) in rust],
        )
    except (_core.QuantError, TypeError, ValueError) as e:
        msg = str(e)
        m = _LOCATED.match(msg)
        where = f": parameter {rust[int(m.group(1))][1][0]}" if m else ""
        raise type(e)(f"{opt._name}{where}: {msg[m.end() if m else 0 :]}") from None
    for (s, (i, _, _, p, _)), v in zip(rust, views):
        if v[2] is not None:
            s.write_back(opt._local(i, p), v[2])
    # One batch per group and step count (the bias correction).
    batches: dict[tuple[int, int], list] = {}
    for s, (i, gi, _, p, g) in f32:
        batches.setdefault((gi, s.step), []).append((s, opt._local(i, p), g))
    for (gi, _), batch in batches.items():
        f32_slots, ps, gs = (list(x) for x in zip(*batch))
        _sharded.update_f32(f32_slots, ps, gs, hypers[gi], opt._decoupled)
    stepped = []
    for s, (_, gi, *_) in zip(slots, cpu):
        if not isinstance(s, _sharded.F32Slot):
            s.step += 1
            s.hyper = hypers[gi]
            stepped.append(s.light["step"])
    if stepped:
        torch._foreach_add_(stepped, 1.0)


def _views(opt: Any, slot: Any, i: int, p: torch.Tensor, g: torch.Tensor) -> tuple:
    """``(param, grad, padded param or None)`` for the engine: the local tensors, or the
    ``[local_rows, padded]`` row layout of a DTensor parameter (_sharded.py)."""
    local = opt._local(i, p)
    if isinstance(slot, _sharded.RowSlot):
        return slot.views(local, g)
    return local.detach(), g, None


def _all_finite(grads: list[torch.Tensor]) -> bool:
    """Whether every value of the CPU tensors ``grads`` is finite."""
    flat = torch.cat([g.reshape(-1) for g in grads]).numpy()
    return bool(np.isfinite(flat.sum()) or np.isfinite(flat).all())
