"""``QatAdamW`` on DTensor parameters (FSDP2 ``fully_shard``; docs/torch.md, "Scaling
out").

Each rank keeps the float32 master and the AdamW moments of its own rows only, and the
engine updates them elementwise, so the master does not depend on where the shards are
cut. The view does: an integer target's grid is calibrated on the min / max of the WHOLE
parameter. The ranks agree on them with one all-reduce per step (every DTensor parameter
of the step in one tensor, per mesh), and the view is the nearest point of that grid
(``quantrs.QuantParams.from_minmax(...).fake_quant``, the engine's own function), so it
equals the view one process computes on the whole tensor. FP8 targets have no calibration:
their view is the engine's. The engine of a sharded integer parameter therefore runs with
an FP8 target (its update of the master does not depend on the target), so a shard that is
all zeros, where a local calibration would fail, steps like any other.

The deploy grid (``grid="deploy"``, ``_qat_grid.py``) is the serving layer's grid: INT4's
scales are per group of inputs of one output row and INT8's per output row, so a rank's
rows (FSDP2 cuts between rows) are quantized exactly as in the whole weight, with no
collective; FP8's one per-tensor scale comes from the whole parameter's absmax, taken from
the same all-reduce.

Stochastic rounding draws from streams keyed by the element's position in the tensor the
engine holds (the local shard here): it is refused for DTensor parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import _core
from ..qat import fake_quant_deploy
from ._dtensor import is_dtensor

_INT_TARGETS = ("int8", "int4")


def check_group(name: str, gi: int, group: dict) -> None:
    """The settings a DTensor parameter's group needs (raise before any change)."""
    where = f"{name}: param_groups[{gi}]"
    if group["rounding"] != "nearest":
        raise _core.InvalidArgument(
            f"{where}['rounding']: expected 'nearest' for DTensor parameters (stochastic "
            f"streams are keyed by the local position), got {group['rounding']!r}"
        )


def check_local(name: str, index: int, local: torch.Tensor) -> None:
    """The views are written through NumPy: a DTensor parameter's shard on the CPU."""
    if local.device.type != "cpu":
        raise _core.UnsupportedOperation(
            f"{name}: parameter {index}: DTensor parameters run on the CPU, got {local.device}"
        )


def engine_group(group: dict) -> dict:
    """The settings the engine of a sharded parameter runs with: an integer target's
    replaced by FP8 E4M3 (see the module docstring)."""
    if group["target"] not in _INT_TARGETS:
        return group
    return {**group, "target": "fp8_e4m3", "scheme": "symmetric"}


def placed(local: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's part of a tensor shaped like ``p``) as ``p`` is: a DTensor
    with ``p``'s mesh and placements, or ``local`` itself."""
    if not is_dtensor(p):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
    )


@torch.no_grad()
def write_views(items: list[tuple[torch.Tensor, Any]]) -> None:
    """The fake-quantized view of every ``(DTensor parameter, slot)`` into its local
    shard, integer grids calibrated on the whole parameter's min / max (a collective:
    every rank calls it with the same parameters, in the same order)."""
    import torch.distributed as dist

    by_mesh: dict[int, list[tuple[torch.Tensor, Any]]] = {}
    for p, slot in items:
        by_mesh.setdefault(id(p.device_mesh), []).append((p, slot))
    for group in by_mesh.values():
        # (-min, max) per parameter, one MAX all-reduce over every mesh dimension; an
        # empty shard contributes -inf to both.
        ext = torch.full((len(group), 2), -float("inf"), dtype=torch.float32)
        for k, (_, slot) in enumerate(group):
            if slot.master.numel():
                lo, hi = torch.aminmax(slot.master)
                ext[k, 0], ext[k, 1] = -lo, hi
        mesh = group[0][0].device_mesh
        for d in range(mesh.ndim):
            dist.all_reduce(ext, op=dist.ReduceOp.MAX, group=mesh.get_group(d))
        for (p, slot), (nlo, hi) in zip(group, ext.tolist()):
            _write_one(p, slot, -nlo, hi)


def _write_one(p: torch.Tensor, slot: Any, lo: float, hi: float) -> None:
    local = p.to_local()
    if local.numel() == 0:
        return
    target, scheme, grid, group_size = slot.fixed
    if grid == "deploy":
        view = _deploy_view(slot.master.numpy(), target, group_size, max(-lo, hi))
    elif target not in _INT_TARGETS:
        view = slot.engine.quantized_weights
    else:
        try:
            qp = _core.QuantParams.from_minmax(lo, hi, target, scheme)
        except (_core.QuantError, ValueError) as e:
            raise type(e)(f"quantrs.torch.QatAdamW: the whole parameter's range: {e}") from None
        view = qp.fake_quant(slot.master.numpy(), rounding="nearest")
    np.copyto(local.detach().numpy(), np.asarray(view).reshape(local.shape))


def _deploy_view(master: np.ndarray, target: str, group_size: int, absmax: float) -> np.ndarray:
    """The serving grid of this rank's rows ``master`` ``[local_rows, in]``: INT4 / INT8
    are row-local; FP8's per-tensor scale is the whole parameter's ``absmax`` / 448, put
    in by one extra row holding ``absmax`` (the serving quantizer's own scale rule, then
    that row dropped)."""
    if target != "fp8_e4m3":
        return fake_quant_deploy(master, target, group_size)
    extra = np.zeros((1, master.shape[1]), np.float32)
    extra[0, 0] = absmax
    return fake_quant_deploy(np.concatenate([master, extra]), target, group_size)[:-1]
