"""``AdamW4bit`` / ``Adam4bit`` as ``torch.optim.Optimizer`` subclasses.

One Rust engine (``quantrs.AdamW4bit`` / ``quantrs.Adam4bit``) per parameter holds that
parameter's packed 4-bit moments and its own step count, as torch's optimizers keep
``state[p]["step"]`` per parameter. Each step hands the engine zero-copy NumPy views of the
parameter (updated in place) and of its gradient. The group's ``lr``, ``betas``, ``eps``
and ``weight_decay`` are read at every step and a change goes to the engine's setters
(``set_lr``, ``set_hyper``: no copy of the state).

Between steps ``optimizer.state[p]`` holds only ``{"step": tensor}``; ``state_dict()``
exports the engines' state as tensors (uint8 codes, float32 scales, a float64 step) and
``load_state_dict()`` imports them, validated in full by the engine
(``export_param_state`` / ``import_param_state``) before anything changes. The step loop and
the state-dict round trip are ``_base.SlotOptimizer``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import torch

from .. import _core
from . import _cuda, _sharded
from ._adam_multi import update_all
from ._base import SlotOptimizer
from ._checks import adam_hyper
from ._dtensor import is_dtensor

# Every engine holds one parameter, updated under this name.
_KEY = "w"

# Quantization choices: fixed per group once a parameter has state.
_QUANT_KEYS = (
    "method",
    "block_size",
    "double_quantization",
    "rank1_normalization",
    "variance_map",
    "min_scale",
    "max_scale",
    "adaptation_rate",
)


class _Slot:
    """One parameter's engine and the light state dict it left in ``optimizer.state``."""

    __slots__ = ("engine", "hyper", "quant", "step", "light")

    def __init__(self, engine: Any, hyper: tuple, quant: tuple, step: int) -> None:
        self.engine = engine
        self.hyper = hyper
        self.quant = quant
        self.step = step
        self.light: dict[str, torch.Tensor] = {}
        self.sync_light()

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.step), dtype=torch.float64)


def _codes_dtype(suffix: str) -> np.dtype:
    # The Rust format: "*_codes" arrays are uint8, every scale is float32.
    return np.dtype(np.uint8) if suffix.endswith("_codes") else np.dtype(np.float32)


def _to_numpy(where: str, key: str, value: Any) -> np.ndarray:
    """A state tensor as the NumPy dtype the Rust format wants (torch may have cast uint8
    codes to the parameter's float dtype; they come back exactly)."""
    want = _codes_dtype(key)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: state[{key!r}]: expected a tensor, got {type(value).__name__}")
    t = value.detach().cpu()
    if want == np.uint8 and t.dtype != torch.uint8:
        ok = t.is_floating_point() or t.dtype in (torch.int16, torch.int32, torch.int64)
        if not ok or not bool(((t >= 0) & (t <= 255) & (t == torch.round(t))).all()):
            raise _core.InvalidArgument(
                f"{where}: state[{key!r}]: expected uint8 codes, got {t.dtype}"
            )
        t = t.to(torch.uint8)
    elif want == np.float32 and t.dtype != torch.float32:
        if not t.is_floating_point():
            raise TypeError(f"{where}: state[{key!r}]: expected float32, got {t.dtype}")
        t = t.to(torch.float32)
    return t.contiguous().numpy()


def _step_of(where: str, state: dict) -> int:
    if "step" not in state:
        raise _core.InvalidArgument(f"{where}: state has no 'step'")
    s = state["step"]
    x = float(s.item() if isinstance(s, torch.Tensor) else s)
    if not (x >= 0 and x == int(x)):
        raise _core.InvalidArgument(
            f"{where}: state['step']: expected a whole number >= 0, got {x}"
        )
    return int(x)


class _Adam4bitBase(SlotOptimizer):
    _engine_cls: ClassVar[Any]
    # AdamW's decoupled decay (else Adam's L2 decay), for the float32 moments of 1-D
    # DTensor parameters (_sharded.py).
    _decoupled: ClassVar[bool]
    _has_device_engine = True
    _takes_dtensor = True
    _name: ClassVar[str]

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        block_size: int = 64,
        method: str = "nf4",
        double_quantization: bool | None = None,
        rank1_normalization: bool | None = None,
        variance_map: str | None = None,
        min_scale: float | None = None,
        max_scale: float | None = None,
        adaptation_rate: float | None = None,
    ) -> None:
        quantization = dict(
            block_size=block_size,
            method=method,
            double_quantization=double_quantization,
            rank1_normalization=rank1_normalization,
            variance_map=variance_map,
            min_scale=min_scale,
            max_scale=max_scale,
            adaptation_rate=adaptation_rate,
        )
        self._start(params, lr, betas, eps, weight_decay, **quantization)

    # ---- groups ------------------------------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        try:
            adam_hyper(self._name, gi, self.param_groups[gi])
            self._quant_config(gi, self.param_groups[gi])
        except Exception:
            self.param_groups.pop()
            raise

    def _quant_config(self, gi: int, group: dict, layout: int = 0) -> Any:
        """The group's quantization config; ``layout`` 1 or 2: that of the sharded row
        layout (no rank-1 normalization; layout 1 keeps float32 block scales;
        _sharded.py)."""
        kw = {k: group[k] for k in _QUANT_KEYS[2:] if group.get(k) is not None}
        if layout:
            if kw.get("rank1_normalization"):
                raise _core.InvalidArgument(
                    f"{self._name}: param_groups[{gi}]['rank1_normalization']: expected "
                    "False or None for DTensor parameters (the column maxima span the ranks)"
                )
            if layout == _sharded.F32_SCALE_LAYOUT:
                kw["double_quantization"] = False
        try:
            return _core.AdvancedQuantizationConfig(group["method"], group["block_size"], **kw)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{self._name}: param_groups[{gi}]: {e}") from None

    def _new_engine(
        self,
        gi: int,
        group: dict,
        hyper: tuple,
        p: torch.Tensor,
        layout: int = 0,
        place: Any = None,
    ) -> Any:
        """An engine, moved to the parameter's device for a CUDA parameter; ``layout`` and
        ``place``: for the sharded row layout (_sharded.py) of the rows ``place`` holds."""
        lr, b1, b2, eps, wd = hyper
        engine = _cuda.new_engine(
            self._engine_cls,
            _core.Adam4bitOptimizerConfig(lr, b1, b2, eps, wd),
            self._quant_config(gi, group, layout),
            p,
        )
        if layout == _sharded.ROW_LAYOUT:
            engine.set_row_layout(place.first_row, place.global_rows)
        return engine

    def _row_widths(self, gi, group, hyper, padded: int, layout: int) -> dict[str, int]:
        """The bytes / floats per row of each row-layout state tensor (from a one-row
        engine), for a rank that holds no rows of the parameter."""
        one_row = _sharded.Placed(torch.empty(1))
        engine = self._new_engine(gi, group, hyper, torch.empty(0), layout, one_row)
        z = np.zeros((1, padded), np.float32)
        engine.update(z, z.copy(), name=_KEY)
        _, arrays = engine.export_param_state(_KEY)
        return {k: int(a.size) for k, a in arrays.items()}

    def _new_sharded(self, i: int, gi: int, group: dict, p: torch.Tensor, hyper: tuple):
        """A fresh slot in the sharded layout (_sharded.py), chosen from ``p``'s global
        shape: 4-bit rows for 2-D and up, float32 moments for 1-D."""
        local = self._local(i, p)
        quant = self._quant_of(group)
        if not _sharded.is_rows(p):
            return _sharded.new_f32(hyper, quant, local, p)
        return self._row_slot(gi, group, hyper, p, local, 0, _sharded.layout_for(local))

    def _row_slot(self, gi, group, hyper, p, local, step, layout, state=None, where=""):
        """A ``RowSlot`` of ``p``'s local rows in ``layout``: fresh, or holding the saved
        row arrays ``state`` (checked before anything changes)."""
        geometry = _sharded.row_geometry(local, group["block_size"])
        rows, _, padded = geometry
        place = _sharded.Placed(p)
        arrays = None if state is None else _sharded.row_arrays(where, state, rows, _to_numpy)
        engine = widths = None
        if rows > 0:
            engine = self._new_engine(gi, group, hyper, local, layout, place)
            if arrays is not None:
                try:
                    engine.import_param_state(_KEY, (rows, padded), step, arrays)
                except (_core.QuantError, TypeError, ValueError) as e:
                    raise type(e)(f"{where}: {e}") from None
        else:
            widths = self._row_widths(gi, group, hyper, padded, layout)
            if arrays is not None:
                got = {k: int(_sharded.local_of(state[k]).shape[1]) for k in arrays}
                if got != widths:
                    raise _core.InvalidArgument(
                        f"{where}: row-layout state widths {got}, expected {widths}"
                    )
        quant = self._quant_of(group)
        return _sharded.RowSlot(engine, hyper, quant, step, geometry, place, layout, widths)

    @staticmethod
    def _quant_of(group: dict) -> tuple:
        return tuple(group.get(k) for k in _QUANT_KEYS)

    # ---- import / export of one parameter's state --------------------------------------

    def _import(self, i: int, gi: int, group: dict, p: torch.Tensor, state: dict) -> _Slot:
        """A new slot holding ``state`` (validated by the Rust loader)."""
        where = f"{self._name}: parameter {i}"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict of state, got {type(state).__name__}")
        hyper = adam_hyper(self._name, gi, group)
        local = self._local(i, p)
        step = _step_of(where, state)
        try:
            layout = _sharded.layout_of(state)
        except _core.SerializationError as e:
            raise _core.SerializationError(f"{where}: {e}") from None
        if layout is not None:
            return self._import_sharded(where, gi, group, hyper, p, local, step, state, layout)
        if is_dtensor(p):
            raise _core.SerializationError(
                f"{where}: the state has no 'layout': it is the flat layout of a plain "
                "tensor, or a per-rank file of quantrs before the sharded layout; a DTensor "
                'parameter needs the sharded layout (docs/torch.md, "Scaling out": resume '
                "such a file with that version at the same world size, or restart the "
                "optimizer state)"
            )
        engine = self._new_engine(gi, group, hyper, local)
        arrays = {k: _to_numpy(where, k, v) for k, v in state.items() if k != "step"}
        try:
            engine.import_param_state(_KEY, tuple(local.shape), step, arrays)
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        return _Slot(engine, hyper, self._quant_of(group), step)

    def _import_sharded(self, where, gi, group, hyper, p, local, step, state, layout) -> Any:
        """A slot in the sharded layout from a saved state (DTensors or, from a full state
        dict, whole tensors: this rank's rows are taken; checked before anything
        changes)."""
        quant = self._quant_of(group)
        if not _sharded.is_rows(p):
            return _sharded.import_f32(where, hyper, quant, local, p, step, state)
        if layout == _sharded.ROW_LAYOUT and local.device.type != "cpu":
            raise _core.UnsupportedOperation(
                f"{where}: sharded layout {layout} (row-grouped scales) steps on the CPU "
                f"only; this parameter is on {local.device}"
            )
        return self._row_slot(gi, group, hyper, p, local, step, layout, state, where)

    def _export(self, slot: Any) -> dict[str, torch.Tensor]:
        if isinstance(slot, (_sharded.RowSlot, _sharded.F32Slot)):
            return slot.export()
        step, arrays = slot.engine.export_param_state(_KEY)
        out = {"step": torch.tensor(float(step), dtype=torch.float64)}
        out.update({k: torch.from_numpy(v) for k, v in sorted(arrays.items())})
        return out

    def _check_fixed(self, i: int, gi: int, group: dict, p: torch.Tensor) -> None:
        slot = self._slots.get(p)
        if slot is not None and slot.quant != self._quant_of(group):
            raise _core.InvalidState(
                f"{self._name}: param_groups[{gi}]: the quantization settings "
                f"({', '.join(_QUANT_KEYS)}) cannot change once parameter {i} has state"
            )

    def _adopt_loaded(self, fresh: dict[torch.Tensor, Any]) -> None:
        # Parameters without state in the loaded dict start afresh at their next step.
        self._slots = {}
        super()._adopt_loaded(fresh)

    def _slot_for(self, i: int, gi: int, group: dict, p: torch.Tensor, hyper: tuple) -> _Slot:
        """``p``'s slot (a new one at its first step, over ``p``'s local shard under
        FSDP2), with the group's hyper-parameters."""
        slot = self._slots.get(p)
        if slot is None:
            if is_dtensor(p):
                slot = self._new_sharded(i, gi, group, p, hyper)
            else:
                engine = self._new_engine(gi, group, hyper, self._local(i, p))
                slot = _Slot(engine, hyper, self._quant_of(group), 0)
            self._adopt(p, slot)
        elif slot.hyper != hyper:
            self._retune(slot, hyper)
        return slot

    # Every CPU parameter of a group in one call (_adam_multi.py), which checks the
    # gradients' values itself before it updates any.
    _engine_checks_cpu_grads = True

    def _update_all(self, work: list[tuple], hypers: dict[int, tuple]) -> None:
        update_all(self, work, hypers)

    def _update(self, i, gi, group, p, g, hyper) -> None:
        # ``g`` is already local; ``p`` is the slot key (a DTensor under FSDP2).
        local = self._local(i, p)
        slot = self._slot_for(i, gi, group, p, hyper)
        if isinstance(slot, _sharded.F32Slot):
            slot.update(local, g, hyper, self._decoupled)
            return
        if slot.engine is None:  # a rank without rows of the parameter
            slot.step += 1
            slot.sync_light()
            return
        padded = None
        pv, gv = local, g
        if isinstance(slot, _sharded.RowSlot):
            pv, gv, padded = slot.views(local, g)
        try:
            slot.engine.update(_cuda.view(pv), _cuda.view(gv), name=_KEY)
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{self._name}: parameter {i}: {e}") from None
        if isinstance(slot, _sharded.RowSlot):
            slot.write_back(local, padded)
        slot.engine.step()
        slot.step += 1
        slot.sync_light()

    def _retune(self, slot: _Slot, hyper: tuple) -> None:
        """Give the engine the group's current hyper-parameters."""
        if slot.hyper[1:] == hyper[1:]:
            slot.engine.set_lr(hyper[0])
        else:
            slot.engine.set_hyper(*hyper)
        slot.hyper = hyper

    # ---- measurements ------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this process (the engines' live buffers)."""
        return sum(_slot_bytes(s) for s in self._slots.values())


def _slot_bytes(slot: Any) -> int:
    if isinstance(slot, _sharded.F32Slot):
        return slot.bytes()
    return 0 if slot.engine is None else int(slot.engine.memory_usage().total_bytes)


class AdamW4bit(_Adam4bitBase):
    """AdamW (decoupled weight decay, torch.optim.AdamW's update) with 4-bit moments.

    ``quantrs.torch.AdamW4bit(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2, *, block_size=64, method="nf4", ...)``; the keyword-only options
    are those of ``quantrs.AdvancedQuantizationConfig`` (None: its default). Parameters
    must be contiguous float32 tensors, on the CPU or a CUDA device; see docs/torch.md.
    """

    _engine_cls = _core.AdamW4bit
    _name = "quantrs.torch.AdamW4bit"
    _decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        **kw: Any,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, **kw)


class Adam4bit(_Adam4bitBase):
    """Adam with L2 weight decay (torch.optim.Adam's update) and 4-bit moments."""

    _engine_cls = _core.Adam4bit
    _name = "quantrs.torch.Adam4bit"
    _decoupled = False
