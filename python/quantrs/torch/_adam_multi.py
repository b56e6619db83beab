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

import torch

from .. import _core

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
    try:
        _core.adam4bit_multi_step(
            [s.engine for s in slots],
            [opt._local(i, p).detach().numpy() for i, _, _, p, _ in cpu],
            [g.numpy() for *_, g in cpu],
            name="w",
            hyper=[hypers[gi] for _, gi, *_ in cpu],
        )
    except (_core.QuantError, TypeError, ValueError) as e:
        msg = str(e)
        m = _LOCATED.match(msg)
        where = f": parameter {cpu[int(m.group(1))][0]}" if m else ""
        raise type(e)(f"{opt._name}{where}: {msg[m.end() if m else 0 :]}") from None
    for s, (_, gi, *_) in zip(slots, cpu):
        s.step += 1
        s.hyper = hypers[gi]
    torch._foreach_add_([s.light["step"] for s in slots], 1.0)
