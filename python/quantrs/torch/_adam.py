"""``AdamW4bit`` / ``Adam4bit`` as ``torch.optim.Optimizer`` subclasses.

One Rust engine (``quantrs.AdamW4bit`` / ``quantrs.Adam4bit``) per parameter holds that
parameter's packed 4-bit moments and its own step count, as torch's optimizers keep
``state[p]["step"]`` per parameter. Each step hands the engine zero-copy NumPy views of the
parameter (updated in place) and of its gradient. The group's ``lr``, ``betas``, ``eps``
and ``weight_decay`` are read at every step: ``lr`` goes to the engine's setter, a change of
the others re-seals the engine's state with the new values (a copy of the state, so cheap
next to a step only when rare).

Between steps ``optimizer.state[p]`` holds only ``{"step": tensor}``; ``state_dict()``
exports the engines' state as tensors (uint8 codes, float32 scales, a float64 step) and
``load_state_dict()`` imports them, validated in full before anything changes. A state
put into ``optimizer.state[p]`` from outside (as ``ZeroRedundancyOptimizer.load_state_dict``
does) is imported at the next ``step()`` / ``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch.optim import Optimizer

from .. import _core
from . import _rust_state
from ._checks import adam_hyper, check_grad, check_param, numpy_view

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
            raise ValueError(f"{where}: state[{key!r}]: expected uint8 codes, got {t.dtype}")
        t = t.to(torch.uint8)
    elif want == np.float32 and t.dtype != torch.float32:
        if not t.is_floating_point():
            raise TypeError(f"{where}: state[{key!r}]: expected float32, got {t.dtype}")
        t = t.to(torch.float32)
    return t.contiguous().numpy()


def _step_of(where: str, state: dict) -> int:
    if "step" not in state:
        raise ValueError(f"{where}: state has no 'step'")
    s = state["step"]
    x = float(s.item() if isinstance(s, torch.Tensor) else s)
    if not (x >= 0 and x == int(x)):
        raise ValueError(f"{where}: state['step']: expected a whole number >= 0, got {x}")
    return int(x)


class _Adam4bitBase(Optimizer):
    _engine_cls: ClassVar[Any]
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
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            block_size=block_size,
            method=method,
            double_quantization=double_quantization,
            rank1_normalization=rank1_normalization,
            variance_map=variance_map,
            min_scale=min_scale,
            max_scale=max_scale,
            adaptation_rate=adaptation_rate,
        )
        self._slots: dict[torch.Tensor, _Slot] = {}
        super().__init__(params, defaults)

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

    def _quant_config(self, gi: int, group: dict) -> Any:
        kw = {k: group[k] for k in _QUANT_KEYS[2:] if group.get(k) is not None}
        try:
            return _core.AdvancedQuantizationConfig(group["method"], group["block_size"], **kw)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{self._name}: param_groups[{gi}]: {e}") from None

    def _new_engine(self, gi: int, group: dict, hyper: tuple) -> Any:
        lr, b1, b2, eps, wd = hyper
        return self._engine_cls.with_quantization_config(
            _core.Adam4bitOptimizerConfig(lr, b1, b2, eps, wd), self._quant_config(gi, group)
        )

    @staticmethod
    def _quant_of(group: dict) -> tuple:
        return tuple(group.get(k) for k in _QUANT_KEYS)

    def _indexed(self) -> Iterable[tuple[int, int, dict, torch.Tensor]]:
        """``(param index, group index, group, param)`` in state-dict order."""
        i = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                yield i, gi, group, p
                i += 1

    # ---- import / export of one parameter's state --------------------------------------

    def _import(self, i: int, gi: int, group: dict, p: torch.Tensor, state: dict) -> _Slot:
        """A new slot holding ``state`` (validated by the Rust loader)."""
        where = f"{self._name}: parameter {i}"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict of state, got {type(state).__name__}")
        hyper = adam_hyper(self._name, gi, group)
        engine = self._new_engine(gi, group, hyper)
        step = _step_of(where, state)
        arrays = {k: _to_numpy(where, k, v) for k, v in state.items() if k != "step"}
        rust = _rust_state.join(engine.state_dict(), step, tuple(p.shape), arrays)
        try:
            engine.load_state_dict(rust)
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{where}: {e}") from None
        return _Slot(engine, hyper, self._quant_of(group), step)

    def _export(self, slot: _Slot) -> dict[str, torch.Tensor]:
        step, arrays = _rust_state.split(slot.engine.state_dict())
        out = {"step": torch.tensor(float(step), dtype=torch.float64)}
        out.update({k: torch.from_numpy(v) for k, v in sorted(arrays.items())})
        return out

    def _import_pending(self) -> None:
        """Adopt states placed in ``self.state`` from outside (all checked first)."""
        fresh = {}
        for i, gi, group, p in self._indexed():
            st = self.state.get(p)
            slot = self._slots.get(p)
            if st is None or (slot is not None and st is slot.light):
                continue
            if not st:  # an empty dict: nothing to adopt
                continue
            fresh[p] = self._import(i, gi, group, p, st)
        for p, slot in fresh.items():
            self._slots[p] = slot
            self.state[p] = slot.light

    # ---- torch.optim.Optimizer API -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self._import_pending()
        saved = {}
        for p, slot in self._slots.items():
            if self.state.get(p) is slot.light:
                saved[p] = slot.light
                self.state[p] = self._export(slot)
        try:
            return super().state_dict()
        finally:
            for p, light in saved.items():
                self.state[p] = light

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups, saved_groups = self.param_groups, state_dict.get("param_groups")
        if not isinstance(saved_groups, list) or len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError(
                "loaded state dict contains a parameter group that doesn't match the size "
                "of optimizer's group"
            )
        id_map = dict(
            zip(
                chain.from_iterable(s["params"] for s in saved_groups),
                chain.from_iterable(g["params"] for g in groups),
            )
        )
        # Validate and build every engine first: a bad state changes nothing.
        fresh = {}
        i = 0
        for gi, (g, s) in enumerate(zip(groups, saved_groups)):
            merged = {**g, **{k: v for k, v in s.items() if k != "params"}}
            for pid in s["params"]:
                st = state_dict.get("state", {}).get(pid)
                if st:
                    p = id_map[pid]
                    check_param(self._name, i, p)
                    fresh[p] = self._import(i, gi, merged, p, st)
                i += 1
        super().load_state_dict(state_dict)
        self._slots = fresh
        for p, slot in fresh.items():
            self.state[p] = slot.light

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._import_pending()
        # Check everything first: a bad parameter, gradient or group changes nothing.
        work = []
        hypers: dict[int, tuple] = {}
        for i, gi, group, p in self._indexed():
            if p.grad is None:
                continue
            check_param(self._name, i, p)
            g = check_grad(self._name, i, p, p.grad)
            if gi not in hypers:
                hypers[gi] = adam_hyper(self._name, gi, group)
            slot = self._slots.get(p)
            if slot is not None and slot.quant != self._quant_of(group):
                raise ValueError(
                    f"{self._name}: param_groups[{gi}]: the quantization settings "
                    f"({', '.join(_QUANT_KEYS)}) cannot change once parameter {i} has state"
                )
            work.append((i, gi, group, p, g))
        for i, gi, group, p, g in work:
            self._update(i, gi, group, p, g, hypers[gi])
        return loss

    def _update(self, i, gi, group, p, g, hyper) -> None:
        slot = self._slots.get(p)
        if slot is None:
            slot = _Slot(self._new_engine(gi, group, hyper), hyper, self._quant_of(group), 0)
            self._slots[p] = slot
            self.state[p] = slot.light
        elif slot.hyper != hyper:
            self._retune(slot, hyper)
        try:
            slot.engine.update(numpy_view(p), numpy_view(g), name="w")
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{self._name}: parameter {i}: {e}") from None
        slot.engine.step()
        slot.step += 1
        slot.sync_light()

    def _retune(self, slot: _Slot, hyper: tuple) -> None:
        """Give the engine the group's current hyper-parameters."""
        if slot.hyper[1:] == hyper[1:]:
            slot.engine.set_lr(hyper[0])
        else:
            rust = slot.engine.state_dict()
            cfg = rust["config"].copy()
            cfg[:5] = hyper
            meta = _rust_state.meta_of(rust)
            slot.engine.load_state_dict(_rust_state.seal({**rust, "config": cfg}, meta))
        slot.hyper = hyper

    # ---- measurements ------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes of optimizer state held by this process (the engines' live buffers)."""
        return sum(int(s.engine.memory_usage().total_bytes) for s in self._slots.values())


class AdamW4bit(_Adam4bitBase):
    """AdamW (decoupled weight decay, torch.optim.AdamW's update) with 4-bit moments.

    ``quantrs.torch.AdamW4bit(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2, *, block_size=64, method="nf4", ...)``; the keyword-only options
    are those of ``quantrs.AdvancedQuantizationConfig`` (None: its default). Parameters
    must be contiguous float32 CPU tensors; see docs/torch.md.
    """

    _engine_cls = _core.AdamW4bit
    _name = "quantrs.torch.AdamW4bit"

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
