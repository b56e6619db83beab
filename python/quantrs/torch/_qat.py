"""``QatAdamW``: quantization-aware training inside a torch training loop.

Built on ``quantrs.QatOptimizer`` (docs/qat.md): each parameter gets a float32 master copy
(``state[p]["master"]``, updated in place by the Rust kernel through a zero-copy view) and
an engine owning the AdamW moments. After construction and after every step the engine's
fake-quantized view of the master is written into the parameter, so the forward pass sees
quantized weights; the gradient with respect to them is applied to the master unchanged
(straight-through: the grid is calibrated on the master's own range, so no element lies
outside it).

The group's ``lr``, ``betas``, ``eps``, ``weight_decay``, ``rounding`` and ``seed`` are read
at every step and a change goes to the engine's setters (no copy of its state); ``target``
and ``scheme`` are fixed once a parameter has state (the view's grid and its integer
parameters belong to them). The step loop and the state-dict round trip are
``_base.SlotOptimizer``'s.

CUDA parameters get a ``quantrs.QatOptimizer`` moved to their device (``_cuda.py``): the
master stays a CUDA tensor, master and gradient reach the kernels through DLPack and the
view is copied into the parameter on the device, bit-identical to the CPU path.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from .. import _core
from . import _cuda, _qat_dtensor, _qat_grid
from ._base import SlotOptimizer
from ._checks import adam_hyper, check_param, numpy_view
from ._dtensor import is_dtensor

_NAME = "quantrs.torch.QatAdamW"
_TARGETS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")
_GOLDEN = 0x9E3779B97F4A7C15  # spreads the per-parameter seeds (Fibonacci hashing)


class _Slot:
    __slots__ = (
        "engine",
        "master",
        "hyper",
        "fixed",
        "rounding",
        "seed",
        "light",
        "steps",
        "param",
    )

    def __init__(
        self, engine: Any, master: torch.Tensor, hyper: tuple, group: dict, param: Any = None
    ) -> None:
        self.engine, self.master, self.hyper = engine, master, hyper
        self.fixed = _fixed_of(group)
        self.rounding, self.seed = group["rounding"], int(group["seed"])
        # A DTensor parameter (its state is exported as DTensors like it), else None; a
        # rank holding none of its rows has no engine and counts the steps here.
        self.param, self.steps = param, 0
        self.light: dict[str, torch.Tensor] = {"master": master}
        self.sync_light()

    def step_count(self) -> int:
        return self.steps if self.engine is None else int(self.engine.step_count())

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.step_count()), dtype=torch.float64)


def _seed(group_seed: int, index: int) -> int:
    return (int(group_seed) + _GOLDEN * (index + 1)) % (1 << 64)


def _fixed_of(group: dict) -> tuple:
    return (group["target"], group["scheme"], group["grid"], group["group_size"])


class QatAdamW(SlotOptimizer):
    """AdamW on float32 masters with a fake-quantized view in the parameters.

    ``QatAdamW(params, target="int8" | "int4" | "fp8_e4m3" | "fp8_e5m2", lr=1e-3,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, scheme="symmetric",
    rounding="nearest", seed=0, grid="tensor", group_size=32)``. ``seed`` keys the
    stochastic-rounding streams (one per parameter, derived from the seed and the
    parameter's index). Parameters must be
    contiguous float32 tensors on the CPU or a CUDA device (there the state lives on the
    device, ``quantrs.QatOptimizer`` moved there); they are overwritten with the quantized view at
    once.

    ``grid="tensor"`` fakes one per-tensor grid (``quantrs.QatOptimizer``'s);
    ``grid="deploy"`` fakes the serving layer's grid for 2-D weights ``[out, in]`` (INT4
    per ``group_size`` inputs, INT8 per output channel, FP8 E4M3 per tensor;
    ``_qat_grid.py``), and :func:`quantrs.torch.convert_qat` swaps the layers for
    serving modules holding the same codes and scales.
    """

    _name = _NAME
    _has_device_engine = True
    _takes_dtensor = True  # _qat_dtensor.py

    def __init__(
        self,
        params: Iterable[Any],
        target: str = "int8",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        scheme: str = "symmetric",
        rounding: str = "nearest",
        seed: int = 0,
        grid: str = "tensor",
        group_size: int = 32,
    ) -> None:
        fake_quant = dict(target=target, scheme=scheme, rounding=rounding, seed=seed)
        grids = dict(grid=grid, group_size=group_size)  # _qat_grid.py
        self._start(params, lr, betas, eps, weight_decay, **fake_quant, **grids)

    # ---- groups and engines ------------------------------------------------------------

    def _config(self, gi: int, group: dict, hyper: tuple) -> Any:
        if group["target"] not in _TARGETS:
            raise _core.InvalidArgument(
                f"{_NAME}: param_groups[{gi}]['target']: expected one of {_TARGETS}, "
                f"got {group['target']!r}"
            )
        lr, b1, b2, eps, wd = hyper
        try:
            return _core.QatConfig(
                group["target"], group["scheme"], group["rounding"], lr, b1, b2, eps, wd
            )
        except (TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: param_groups[{gi}]: {e}") from None

    def _group_hyper(self, gi: int, group: dict) -> tuple:
        hyper = adam_hyper(_NAME, gi, group)
        self._config(gi, group, hyper)  # target, scheme and rounding checked too
        _qat_grid.check_group(_NAME, gi, group)
        _seed_of(gi, group)
        if any(is_dtensor(p) for p in group["params"]):
            _qat_dtensor.check_group(_NAME, gi, group)
        return hyper

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        group = self.param_groups[gi]
        first = sum(len(g["params"]) for g in self.param_groups[:-1])
        try:
            hyper = self._group_hyper(gi, group)
            cfg = self._config(gi, group, hyper)
            fresh = {}
            for k, p in enumerate(group["params"]):
                local = self._local(first + k, p)
                if local is p or local.numel():
                    check_param(_NAME, first + k, local, cuda=True)
                if local is not p:
                    _qat_dtensor.check_local(_NAME, first + k, local)
                _qat_grid.check_param(_NAME, first + k, local, group)
                master = local.detach().clone()
                fresh[p] = self._new_slot(first + k, gi, group, hyper, cfg, master, p)
        except Exception:
            self.param_groups.pop()
            raise
        for p, slot in fresh.items():
            self._adopt(p, slot)
        self._write_views(list(fresh.items()))

    def _write_views(self, items: list[tuple[torch.Tensor, _Slot]]) -> None:
        """The views into the parameters; those of DTensor parameters agreed between the
        ranks (_qat_dtensor.py, a collective)."""
        for p, slot in items:
            if slot.param is None:
                _write_view(p, slot)
        sharded = [(p, slot) for p, slot in items if slot.param is not None]
        if sharded:
            _qat_dtensor.write_views(sharded)

    def _new_slot(
        self, i: int, gi: int, group: dict, hyper: tuple, cfg: Any, master: torch.Tensor, p: Any
    ) -> _Slot:
        """A slot over ``master`` (the local rows of a DTensor ``p``: an engine with the
        settings of _qat_dtensor.engine_group, none where there are no rows)."""
        param = p if is_dtensor(p) else None
        if param is not None:
            engine_group = _qat_dtensor.engine_group(group)
            cfg = self._config(gi, engine_group, hyper)
            if master.numel() == 0:
                return _Slot(None, master, hyper, group, param)
        try:
            seed = _seed(group["seed"], i)
            if _cuda.is_cuda(master):
                engine = _cuda.new_qat_engine(master, cfg, seed)
            else:
                engine = _core.QatOptimizer(numpy_view(master), cfg, rng=seed)
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
        return _Slot(engine, master, hyper, group, param)

    # ---- state import / export (a restored state leaves the parameter alone: the
    # model's own state dict holds the view it saved) ----------------------------------

    def _import(self, i: int, gi: int, group: dict, p: torch.Tensor, state: dict) -> _Slot:
        where = f"{_NAME}: parameter {i}"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict of state, got {type(state).__name__}")
        missing = {"step", "master", "exp_avg", "exp_avg_sq"} - set(state)
        if missing:
            raise _core.InvalidArgument(f"{where}: state lacks {sorted(missing)}")
        arrays = {}
        local = self._local(i, p)
        for k in ("master", "exp_avg", "exp_avg_sq"):
            t = state[k]
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{where}: state[{k!r}]: expected a float tensor")
            if is_dtensor(t):
                t = t.to_local()
            if t.shape != local.shape:
                raise _core.InvalidArgument(
                    f"{where}: state[{k!r}]: expected shape {tuple(local.shape)}, got "
                    f"{tuple(t.shape)}"
                )
            arrays[k] = t.detach().cpu().to(torch.float32).contiguous()
        s = state["step"]
        step = float(s.item() if isinstance(s, torch.Tensor) else s)
        if not (step >= 0 and step == int(step)):
            raise _core.InvalidArgument(
                f"{where}: state['step']: expected a whole number >= 0, got {step}"
            )
        hyper = self._group_hyper(gi, group)
        master = arrays["master"].to(local.device, copy=True)
        slot = self._new_slot(i, gi, group, hyper, self._config(gi, group, hyper), master, p)
        if slot.engine is None:
            slot.steps = int(step)
            slot.sync_light()
            return slot
        try:
            slot.engine.set_moments(
                int(step), arrays["exp_avg"].numpy(), arrays["exp_avg_sq"].numpy()
            )
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        slot.sync_light()
        return slot

    def _export(self, slot: _Slot) -> dict[str, torch.Tensor]:
        if slot.engine is None:
            m = v = np.zeros(slot.master.shape, np.float32)
        else:
            m, v = slot.engine.moments()
        shape = slot.master.shape
        out = {
            "master": slot.master,
            "exp_avg": torch.from_numpy(np.asarray(m, np.float32)).reshape(shape),
            "exp_avg_sq": torch.from_numpy(np.asarray(v, np.float32)).reshape(shape),
        }
        if slot.param is not None:
            out = {k: _qat_dtensor.placed(t, slot.param) for k, t in out.items()}
        step = torch.tensor(float(slot.step_count()), dtype=torch.float64)
        return {"step": step, **out}

    # ---- the step ----------------------------------------------------------------------

    def _check_fixed(self, i: int, gi: int, group: dict, p: torch.Tensor) -> None:
        if self._slots[p].fixed != _fixed_of(group):
            raise _core.InvalidState(
                f"{_NAME}: param_groups[{gi}]: target and scheme cannot change once "
                f"parameter {i} has state"
            )

    def _update(
        self, i: int, gi: int, group: dict, p: torch.Tensor, g: torch.Tensor, hyper: tuple
    ) -> None:
        slot = self._slots[p]
        if slot.engine is None:  # a rank without rows of a DTensor parameter
            slot.steps += 1
            slot.sync_light()
            return
        self._retune(i, slot, group, hyper)
        try:
            slot.engine.step(_cuda.view(slot.master), _cuda.view(g))
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
        if slot.param is None:  # DTensor views: all at once, after every update
            _write_view(p, slot)
        slot.sync_light()

    def _update_all(self, work: list[tuple], hypers: dict[int, tuple]) -> None:
        super()._update_all(work, hypers)
        sharded = [(p, self._slots[p]) for _, _, _, p, _ in work if is_dtensor(p)]
        if sharded:
            _qat_dtensor.write_views(sharded)

    @staticmethod
    def _retune(i: int, slot: _Slot, group: dict, hyper: tuple) -> None:
        """Give the engine the group's current settings through its setters (all were
        checked by ``_group_hyper``)."""
        if slot.hyper != hyper:
            slot.engine.set_hyper(*hyper)
            slot.hyper = hyper
        if slot.rounding != group["rounding"] and slot.param is None:
            slot.engine.set_rounding(group["rounding"])
            slot.rounding = group["rounding"]
        if slot.seed != int(group["seed"]):
            slot.engine.set_seed(_seed(group["seed"], i))
            slot.seed = int(group["seed"])

    def state_bytes(self) -> int:
        """Bytes of optimizer state: masters and the engines' moments and views."""
        return sum(4 * 4 * s.master.numel() for s in self._slots.values())


def _write_view(p: torch.Tensor, slot: _Slot) -> None:
    """The fake-quantized view into the parameter: the serving layer's grid for
    ``grid="deploy"`` (``_qat_grid.py``); else the engine's per-tensor view, a NumPy copy on
    the CPU, a device-to-device copy (the view read zero-copy through DLPack) on CUDA."""
    engine = slot.engine
    target, _, grid, group_size = slot.fixed
    if grid == "deploy":
        p.detach().copy_(_qat_grid.fake_quantize(slot.master, target, group_size))
    elif _cuda.is_cuda(p):
        p.detach().copy_(torch.from_dlpack(engine.quantized_weights).reshape(p.shape))
    else:
        np.copyto(numpy_view(p), engine.quantized_weights.reshape(p.shape))


def _seed_of(gi: int, group: dict) -> int:
    s = group["seed"]
    try:
        return operator.index(s)
    except TypeError:
        raise TypeError(
            f"{_NAME}: param_groups[{gi}]['seed']: expected an int, got {s!r}"
        ) from None
