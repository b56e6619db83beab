"""The sharded layout of ``AdamW4bit`` / ``Adam4bit`` state: what makes the step of a
DTensor parameter independent of the world size, and its state a DTensor that
``torch.distributed.checkpoint`` reshards (docs/torch.md, "Scaling out").

FSDP2 cuts a parameter between rows (dim 0) at places that move with the world size. The
flat layout of a plain tensor (blocks of 64 over the flattened tensor, their scales
double-quantized per 256 blocks, v's scale rounding keyed by the element count and the
block index) puts blocks and groups across those cuts. A DTensor parameter is therefore
laid out from its GLOBAL shape, so that no number depends on more than one row:

- 2-D and up (``rows = shape[0]``, a row of ``prod(shape[1:])`` elements): each row is
  padded with zeros to a multiple of the block size, so blocks never cross a row. Layout
  2 (CPU parameters): the engine's row layout (``set_row_layout``) double-quantizes the
  block scales in groups of up to 256 blocks that restart at every row, and keys v's
  scale rounding by the global row, so a rank's rows step as they would in one process.
  Layout 1 (CUDA parameters, whose kernels group 256 blocks over the flat tensor, and
  files written with it): float32 block scales. The engine steps the local rows as one
  ``[local_rows, padded]`` parameter; the padding has a zero gradient and stays zero.
- 1-D (biases, norms: a shard boundary can fall between any two elements): float32
  moments stepped elementwise (NumPy on the CPU) with correctly rounded operations only
  (no fused multiply-add, which a kernel's vector body and its tail may use
  differently), so each element's bits are its own.

Every state tensor has one row per parameter row (``m_codes [rows, padded / 2]``,
``m_scale_codes [rows, blocks]`` and ``m_scale_groups [rows, 2 * groups]`` or
``m_scales [rows, blocks]``, ...; ``exp_avg`` / ``exp_avg_sq`` in the parameter's shape
for 1-D) and is exported as a DTensor with the parameter's mesh and placements. A
``layout`` entry tells these states apart, and from the flat, per-rank state of earlier
versions, which cannot be resharded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .. import _core
from ._dtensor import is_dtensor

# Layout 2: row-grouped double-quantized scales (CPU); layout 1: float32 block scales.
ROW_LAYOUT = 2
F32_SCALE_LAYOUT = 1
LAYOUTS = (F32_SCALE_LAYOUT, ROW_LAYOUT)
_KEY = "w"
_F32_KEYS = ("exp_avg", "exp_avg_sq")


def layout_of(state: dict) -> int | None:
    """The ``layout`` version of a saved per-parameter state (None: the flat layout)."""
    if "layout" not in state:
        return None
    v = state["layout"]
    x = float(v.item() if isinstance(v, torch.Tensor) else v)
    if x not in LAYOUTS:
        raise _core.SerializationError(
            f"state['layout']: this quantrs reads sharded layouts {list(LAYOUTS)}, got {x:g}"
        )
    return int(x)


def layout_for(local: torch.Tensor) -> int:
    """The layout a fresh sharded state of ``local``'s device takes."""
    return ROW_LAYOUT if local.device.type == "cpu" else F32_SCALE_LAYOUT


def local_of(t: Any) -> torch.Tensor:
    """The local part of a DTensor, or ``t`` itself."""
    return t.to_local() if is_dtensor(t) else t


class Placed:
    """Where a parameter's local rows sit: its global row count, the global index of its
    first local row and, for a DTensor, the mesh and placements its state tensors take."""

    __slots__ = ("global_rows", "first_row", "mesh", "placements")

    def __init__(self, p: torch.Tensor) -> None:
        self.global_rows = int(p.shape[0]) if p.dim() else 1
        self.first_row = 0
        if is_dtensor(p):
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            self.mesh, self.placements = p.device_mesh, tuple(p.placements)
            if p.dim():
                _, offset = compute_local_shape_and_global_offset(
                    p.shape, p.device_mesh, p.placements
                )
                self.first_row = int(offset[0])
        else:
            self.mesh, self.placements = None, ()

    def out(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` (this rank's rows of a state tensor) as the parameter is: a DTensor
        of ``global_rows`` rows, or the tensor itself."""
        if self.mesh is None:
            return local
        from torch.distributed.tensor import DTensor

        shape = (self.global_rows, *local.shape[1:])
        stride = tuple(int(np.prod(shape[k + 1 :])) for k in range(len(shape)))
        return DTensor.from_local(
            local, self.mesh, self.placements, run_check=False, shape=shape, stride=stride
        )


class RowSlot:
    """A 2-D-and-up parameter in the row layout: an engine over ``[local_rows, padded]``
    (none where this rank holds no rows)."""

    __slots__ = (
        "engine",
        "hyper",
        "quant",
        "step",
        "light",
        "rows",
        "row",
        "padded",
        "place",
        "widths",
        "layout",
    )

    def __init__(self, engine, hyper, quant, step, geometry, place, layout, widths=None) -> None:
        self.engine, self.hyper, self.quant, self.step = engine, hyper, quant, step
        self.rows, self.row, self.padded = geometry
        self.place = place
        self.layout = layout
        # For a rank without rows (no engine): the width of each state tensor's rows.
        self.widths: dict[str, int] | None = widths
        self.light: dict[str, torch.Tensor] = {}
        self.sync_light()

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.step), dtype=torch.float64)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.padded)

    def views(self, local: torch.Tensor, g: torch.Tensor) -> tuple[Any, Any, Any]:
        """``(param, grad, padded param or None)`` as the engine takes them,
        ``[local_rows, padded]``: views of the local rows, or zero-padded copies when a row
        is not a whole number of blocks (then :meth:`write_back` the padded param)."""
        if self.padded == self.row:
            return local.detach().view(self.shape), g.view(self.shape), None
        pp = torch.zeros(self.shape, dtype=torch.float32, device=local.device)
        gp = torch.zeros(self.shape, dtype=torch.float32, device=local.device)
        pp[:, : self.row].copy_(local.detach().view(self.rows, self.row))
        gp[:, : self.row].copy_(g.view(self.rows, self.row))
        return pp, gp, pp

    def write_back(self, local: torch.Tensor, padded: torch.Tensor | None) -> None:
        if padded is not None:
            local.detach().view(self.rows, self.row).copy_(padded[:, : self.row])

    def export(self) -> dict[str, torch.Tensor]:
        out = {"step": torch.tensor(float(self.step), dtype=torch.float64)}
        out["layout"] = torch.tensor(float(self.layout), dtype=torch.float64)
        if self.engine is None:
            arrays = {k: np.zeros((0, w), _dtype(k)) for k, w in (self.widths or {}).items()}
        else:
            _, flat = self.engine.export_param_state(_KEY)
            arrays = {k: a.reshape(self.rows, -1) for k, a in flat.items()}
        for k, a in sorted(arrays.items()):
            out[k] = self.place.out(torch.from_numpy(a))
        return out


class F32Slot:
    """A 1-D parameter: float32 moments of the local elements, stepped by :func:`update_f32`."""

    __slots__ = ("engine", "hyper", "quant", "step", "light", "m", "v", "place")

    def __init__(self, hyper, quant, step, m, v, place) -> None:
        self.engine = None
        self.hyper, self.quant, self.step, self.m, self.v = hyper, quant, step, m, v
        self.place = place
        self.light: dict[str, torch.Tensor] = {}
        self.sync_light()

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.step), dtype=torch.float64)

    def update(self, p: torch.Tensor, g: torch.Tensor, hyper: tuple, decoupled: bool) -> None:
        update_f32([self], [p], [g], hyper, decoupled)

    def bytes(self) -> int:
        return 4 * (self.m.numel() + self.v.numel())

    def export(self) -> dict[str, torch.Tensor]:
        return {
            "step": torch.tensor(float(self.step), dtype=torch.float64),
            "layout": torch.tensor(float(ROW_LAYOUT), dtype=torch.float64),
            "exp_avg": self.place.out(self.m.clone()),
            "exp_avg_sq": self.place.out(self.v.clone()),
        }


@torch.no_grad()
def update_f32(
    slots: list[F32Slot],
    ps: list[torch.Tensor],
    gs: list[torch.Tensor],
    hyper: tuple,
    decoupled: bool,
) -> None:
    """torch's Adam / AdamW update of ``slots`` (one group, one step count), each element
    on its own: separate, correctly rounded operations in a fixed order (no fused
    multiply-add), so its bits do not depend on where it sits in the tensor.

    The tensors are concatenated, so each operation is one call for all of them. On the
    CPU the arithmetic runs in NumPy, in this thread: torch hands tensors of more than
    32 K elements to its OpenMP pool, which cost 50-400 ms per step (for 0.1 M elements)
    right after the engines' own threads on a busy 2-core machine."""
    if not slots:
        return
    lr, b1, b2, eps, wd = hyper
    step = slots[0].step + 1
    flat = [p.detach().view(-1) for p in ps]
    pt, gt = torch.cat(flat), torch.cat([g.reshape(-1) for g in gs])
    mt = torch.cat([s.m.view(-1) for s in slots])
    vt = torch.cat([s.v.view(-1) for s in slots])
    cpu = pt.device.type == "cpu"
    p, g, m, v = (t.numpy() for t in (pt, gt, mt, vt)) if cpu else (pt, gt, mt, vt)
    if wd != 0:
        if decoupled:  # the engine's decay: w - f32(lr * wd) * w
            p -= p * float(np.float32(lr * wd))
        else:
            g = g + p * wd
    m *= b1
    m += g * (1 - b1)
    v *= b2
    v += (g * g) * (1 - b2)
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    denom = np.sqrt(v) if cpu else v.sqrt()
    denom /= math.sqrt(bc2)
    denom += eps
    p -= (m / denom) * (lr / bc1)
    sizes = [t.numel() for t in flat]
    torch._foreach_copy_(flat, list(pt.split(sizes)))
    torch._foreach_copy_([s.m.view(-1) for s in slots], list(mt.split(sizes)))
    torch._foreach_copy_([s.v.view(-1) for s in slots], list(vt.split(sizes)))
    for s in slots:
        s.step, s.hyper = step, hyper
    torch._foreach_add_([s.light["step"] for s in slots], 1.0)


def _dtype(key: str) -> np.dtype:
    return np.dtype(np.uint8) if key.endswith("_codes") else np.dtype(np.float32)


def row_geometry(local: torch.Tensor, block_size: int) -> tuple[int, int, int]:
    """``(local rows, row length, padded row length)`` of a 2-D-and-up parameter."""
    rows = int(local.shape[0])
    row = int(np.prod(local.shape[1:]))
    return rows, row, -(-row // block_size) * block_size


def is_rows(p: torch.Tensor) -> bool:
    """True where the sharded layout keeps 4-bit rows (else float32 moments)."""
    return p.dim() >= 2


def new_f32(hyper: tuple, quant: tuple, local: torch.Tensor, p: torch.Tensor) -> F32Slot:
    z = torch.zeros(local.shape, dtype=torch.float32, device=local.device)
    return F32Slot(hyper, quant, 0, z, z.clone(), Placed(p))


def import_f32(
    where: str,
    hyper: tuple,
    quant: tuple,
    local: torch.Tensor,
    p: torch.Tensor,
    step: int,
    state: dict,
) -> F32Slot:
    """An ``F32Slot`` from a saved state (every tensor checked first)."""
    extra = set(state) - {"step", "layout", *_F32_KEYS}
    missing = set(_F32_KEYS) - set(state)
    if missing or extra:
        raise _core.InvalidArgument(
            f"{where}: a 1-D parameter's sharded state holds step, layout, exp_avg and "
            f"exp_avg_sq; missing {sorted(missing)}, unexpected {sorted(extra)}"
        )
    mv = []
    for k in _F32_KEYS:
        t = local_of(state[k])
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{where}: state[{k!r}]: expected a float tensor")
        if tuple(t.shape) != tuple(local.shape):
            raise _core.InvalidArgument(
                f"{where}: state[{k!r}]: expected this rank's shape {tuple(local.shape)}, "
                f"got {tuple(t.shape)}"
            )
        mv.append(t.detach().to(torch.float32, copy=True).to(local.device).contiguous())
    if not bool((mv[1] >= 0).all()) or not all(bool(torch.isfinite(x).all()) for x in mv):
        raise _core.InvalidArgument(f"{where}: exp_avg / exp_avg_sq: expected finite, v >= 0")
    return F32Slot(hyper, quant, step, mv[0], mv[1], Placed(p))


def row_arrays(where: str, state: dict, rows: int, to_numpy) -> dict[str, np.ndarray]:
    """The saved row-layout arrays of this rank (DTensors taken locally), each with one
    row per local parameter row, flattened as the engine stores them."""
    out = {}
    for k, v in state.items():
        if k in ("step", "layout"):
            continue
        t = local_of(v)
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != rows:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _core.InvalidArgument(
                f"{where}: state[{k!r}]: expected {rows} rows (one per local parameter "
                f"row), got {shape}"
            )
        out[k] = to_numpy(where, k, t).reshape(-1)
    return out
