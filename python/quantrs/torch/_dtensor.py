"""DTensor parameters (FSDP2 ``fully_shard``, tensor parallel) for the 4-bit optimizers.

A DTensor parameter is updated through its local shard: the optimizer steps
``p.to_local()`` with ``p.grad.to_local()`` and keeps 4-bit state for those elements
only, so each rank holds the state of its own shard (docs/torch.md, "Scaling out").
``Shard(d)`` and ``Replicate()`` placements qualify: both give every rank the final
values of its elements. ``Partial`` does not (the local values are summands, not the
parameter), nor does a rank whose shard is empty (it has nothing to update).
"""

from __future__ import annotations

import torch


def dtensor_type() -> type | None:
    """``torch.distributed.tensor.DTensor``, or None in a torch built without it."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


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
        if not isinstance(pl, (Shard, Replicate)):
            raise TypeError(
                f"{where}: a DTensor with placement {type(pl).__name__} {pl} (expected "
                "Shard(d) or Replicate(): the local values must be the parameter's own)"
            )
    with torch.no_grad():
        return t.to_local()
