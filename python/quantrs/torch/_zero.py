"""``QatAdamW`` under ``torch.distributed.optim.ZeroRedundancyOptimizer``.

Each rank's local ``QatAdamW`` holds only its shard and writes the quantized view into
those parameters at construction; ZeRO broadcasts every shard from its owner after each
step, but the first forward pass would see the other shards still in float32.
:func:`broadcast_views` does that broadcast once, right after construction, so ZeRO
trains bit-identically to plain DDP with ``QatAdamW`` (docs/torch.md).
"""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def broadcast_views(zero: Any) -> None:
    """Broadcast every parameter of ``zero`` (a ``ZeroRedundancyOptimizer``) from the
    rank whose local optimizer owns it. Call it on every rank (a collective)."""
    import torch.distributed as dist

    group = zero.join_process_group
    params = [p for g in zero.param_groups for p in g["params"]]
    local = {id(p) for g in zero.optim.param_groups for p in g["params"]}
    rank = dist.get_rank(group)
    # Exactly one rank owns each parameter: the sum of (rank if owned else 0) is its owner.
    owner = torch.tensor([rank if id(p) in local else 0 for p in params], dtype=torch.int64)
    dist.all_reduce(owner, group=group)
    for p, r in zip(params, owner.tolist()):
        dist.broadcast(p.data, src=dist.get_global_rank(group, r), group=group)
