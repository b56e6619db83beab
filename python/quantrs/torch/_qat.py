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
from . import _cuda, _qat_grid
from ._base import SlotOptimizer
from ._checks import adam_hyper, check_param, numpy_view

_NAME = "quantrs.torch.QatAdamW"
_TARGETS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")
_GOLDEN = 0x9E3779B97F4A7C15  # spreads the per-parameter seeds (Fibonacci hashing)


class _Slot:
    __slots__ = ("engine", "master", "hyper", "fixed", "rounding", "seed", "light")

    def __init__(self, engine: Any, master: torch.Tensor, hyper: tuple, group: dict) -> None:
        self.engine, self.master, self.hyper = engine, master, hyper
        self.fixed = _fixed_of(group)
        self.rounding, self.seed = group["rounding"], int(group["seed"])
        self.light: dict[str, torch.Tensor] = {"master": master}
        self.sync_light()

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.engine.step_count()), dtype=torch.float64)


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
                check_param(_NAME, first + k, p, cuda=True)
                _qat_grid.check_param(_NAME, first + k, p, group)
                fresh[p] = self._new_slot(first + k, group, hyper, cfg, p.detach().clone())
        except Exception:
            self.param_groups.pop()
            raise
        for p, slot in fresh.items():
            self._adopt(p, slot)
            _write_view(p, slot)

    def _new_slot(self, i: int, group: dict, hyper: tuple, cfg: Any, master: torch.Tensor):
        try:
            seed = _seed(group["seed"], i)
            if _cuda.is_cuda(master):
                engine = _cuda.new_qat_engine(master, cfg, seed)
            else:
                engine = _core.QatOptimizer(numpy_view(master), cfg, rng=seed)
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
        return _Slot(engine, master, hyper, group)

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
        for k in ("master", "exp_avg", "exp_avg_sq"):
            t = state[k]
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{where}: state[{k!r}]: expected a float tensor")
            if t.shape != p.shape:
                raise _core.InvalidArgument(
                    f"{where}: state[{k!r}]: expected shape {tuple(p.shape)}, got {tuple(t.shape)}"
                )
            arrays[k] = t.detach().cpu().to(torch.float32).contiguous()
        s = state["step"]
        step = float(s.item() if isinstance(s, torch.Tensor) else s)
        if not (step >= 0 and step == int(step)):
            raise _core.InvalidArgument(
                f"{where}: state['step']: expected a whole number >= 0, got {step}"
            )
        hyper = self._group_hyper(gi, group)
        master = arrays["master"].to(p.device, copy=True)
        slot = self._new_slot(i, group, hyper, self._config(gi, group, hyper), master)
        try:
            slot.engine.set_moments(
                int(step), arrays["exp_avg"].numpy(), arrays["exp_avg_sq"].numpy()
            )
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        slot.sync_light()
        return slot

    def _export(self, slot: _Slot) -> dict[str, torch.Tensor]:
        m, v = slot.engine.moments()
        return {
            "step": torch.tensor(float(slot.engine.step_count()), dtype=torch.float64),
            "master": slot.master,
            "exp_avg": torch.from_numpy(np.asarray(m, np.float32)),
            "exp_avg_sq": torch.from_numpy(np.asarray(v, np.float32)),
        }

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
        self._retune(i, slot, group, hyper)
        try:
            slot.engine.step(_cuda.view(slot.master), _cuda.view(g))
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
        _write_view(p, slot)
        slot.sync_light()

    @staticmethod
    def _retune(i: int, slot: _Slot, group: dict, hyper: tuple) -> None:
        """Give the engine the group's current settings through its setters (all were
        checked by ``_group_hyper``)."""
        if slot.hyper != hyper:
            slot.engine.set_hyper(*hyper)
            slot.hyper = hyper
        if slot.rounding != group["rounding"]:
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
