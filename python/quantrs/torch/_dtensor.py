"""DTensor parameters (FSDP2 ``fully_shard``, tensor parallel) for the 4-bit optimizers.

A DTensor parameter is updated through its local shard: the optimizer steps
``p.to_local()`` with ``p.grad.to_local()`` and keeps 4-bit state for those elements
only, so each rank holds the state of its own shard (docs/torch.md, "Scaling out").
``Shard(0)`` and ``Replicate()`` placements qualify: both give every rank whole rows of
the parameter with their final values, so a state laid out row by row (``_sharded.py``)
does not depend on where the shard boundaries fall. ``Shard(d)`` for ``d > 0`` would cut
the rows (and the state's blocks) at the shard boundary, and ``Partial`` gives summands,
not the parameter: both are refused.
"""

from __future__ import annotations

import torch

# (DTensor, Shard, Replicate), looked up once: the checks run per parameter and step.
_TYPES: list[tuple | None] = []


def _types() -> tuple | None:
    if not _TYPES:
        try:
            from torch.distributed.tensor import DTensor, Replicate, Shard
        except ImportError:
            _TYPES.append(None)
        else:
            _TYPES.append((DTensor, Shard, Replicate))
    return _TYPES[0]


def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None in a torch built without it."""
    types = _types()
    return None if types is None else types[0]


def is_dtensor(t: torch.Tensor) -> bool:
    types = _types()
    return types is not None and isinstance(t, types[0])


def local_view(where: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or the local shard of a DTensor ``t`` (the same storage: an in-place
    update of the view is an update of the DTensor)."""
    if not is_dtensor(t):
        return t
    _, shard, replicate = _types()  # type: ignore[misc]
    for pl in t.placements:
        if not (isinstance(pl, replicate) or (isinstance(pl, shard) and pl.dim == 0)):
            raise TypeError(
                f"{where}: a DTensor with placement {pl!r} (expected "
                "Shard(0) or Replicate(): the local values must be whole rows of the "
                "parameter)"
            )
    if not torch.is_grad_enabled():  # the step: no context to enter
        return t.to_local()
    with torch.no_grad():
        return t.to_local()
