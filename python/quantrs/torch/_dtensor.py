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

_DTENSOR: list[type | None] = []  # looked up once (the check runs per parameter and step)


def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None in a torch built without it."""
    if not _DTENSOR:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:
            DTensor = None  # type: ignore[assignment,misc]
        _DTENSOR.append(DTensor)
    return _DTENSOR[0]


def is_dtensor(t: torch.Tensor) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_view(where: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or the local shard of a DTensor ``t`` (the same storage: an in-place
    update of the view is an update of the DTensor)."""
    if not is_dtensor(t):
        return t
    from torch.distributed.tensor import Replicate, Shard

    for pl in t.placements:
        if not (isinstance(pl, Replicate) or (isinstance(pl, Shard) and pl.dim == 0)):
            raise TypeError(
                f"{where}: a DTensor with placement {type(pl).__name__} {pl} (expected "
                "Shard(0) or Replicate(): the local values must be whole rows of the "
                "parameter)"
            )
    with torch.no_grad():
        return t.to_local()
