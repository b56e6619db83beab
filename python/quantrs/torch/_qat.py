"""``QatAdamW``: quantization-aware training inside a torch training loop.

Built on ``quantrs.QatOptimizer`` (docs/qat.md): each parameter gets a float32 master copy
(``state[p]["master"]``, updated in place by the Rust kernel through a zero-copy view) and
an engine owning the AdamW moments. After construction and after every step the engine's
fake-quantized view of the master is written into the parameter, so the forward pass sees
quantized weights; the gradient with respect to them is applied to the master unchanged
(straight-through: the grid is calibrated on the master's own range, so no element lies
outside it).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any, Callable

import numpy as np
import torch
from torch.optim import Optimizer

from .. import _core
from . import _qat_state
from ._checks import adam_hyper, check_grad, check_param, numpy_view

_NAME = "quantrs.torch.QatAdamW"
_TARGETS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2")
_GOLDEN = 0x9E3779B97F4A7C15  # spreads the per-parameter seeds (Fibonacci hashing)


class _Slot:
    __slots__ = ("engine", "master", "hyper", "quant", "light")

    def __init__(self, engine: Any, master: torch.Tensor, hyper: tuple, quant: tuple) -> None:
        self.engine, self.master, self.hyper, self.quant = engine, master, hyper, quant
        self.light: dict[str, torch.Tensor] = {"master": master}
        self.sync_light()

    def sync_light(self) -> None:
        self.light["step"] = torch.tensor(float(self.engine.step_count()), dtype=torch.float64)


def _seed(group_seed: int, index: int) -> int:
    return (int(group_seed) + _GOLDEN * (index + 1)) % (1 << 64)


class QatAdamW(Optimizer):
    """AdamW on float32 masters with a fake-quantized view in the parameters.

    ``QatAdamW(params, target="int8" | "int4" | "fp8_e4m3" | "fp8_e5m2", lr=1e-3,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, scheme="symmetric",
    rounding="nearest", seed=0)``. ``seed`` keys the stochastic-rounding streams (one per
    parameter, derived from the seed and the parameter's index). Parameters must be
    contiguous float32 CPU tensors; they are overwritten with the quantized view at once.
    """

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
    ) -> None:
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            target=target,
            scheme=scheme,
            rounding=rounding,
            seed=seed,
        )
        self._slots: dict[torch.Tensor, _Slot] = {}
        super().__init__(params, defaults)

    # ---- groups and engines ------------------------------------------------------------

    def _config(self, gi: int, group: dict, hyper: tuple) -> Any:
        if group["target"] not in _TARGETS:
            raise ValueError(
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

    @staticmethod
    def _quant_of(group: dict) -> tuple:
        return (group["target"], group["scheme"], group["rounding"], int(group["seed"]))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        gi = len(self.param_groups) - 1
        group = self.param_groups[gi]
        first = sum(len(g["params"]) for g in self.param_groups[:-1])
        try:
            hyper = adam_hyper(_NAME, gi, group)
            cfg = self._config(gi, group, hyper)
            fresh = {}
            for k, p in enumerate(group["params"]):
                check_param(_NAME, first + k, p)
                fresh[p] = self._new_slot(first + k, group, hyper, cfg, p.detach().clone())
        except Exception:
            self.param_groups.pop()
            raise
        for p, slot in fresh.items():
            self._install(p, slot, write_view=True)

    def _new_slot(self, i: int, group: dict, hyper: tuple, cfg: Any, master: torch.Tensor):
        try:
            engine = _core.QatOptimizer(numpy_view(master), cfg, rng=_seed(group["seed"], i))
        except (_core.QuantError, TypeError, ValueError) as e:
            raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
        return _Slot(engine, master, hyper, self._quant_of(group))

    def _install(self, p: torch.Tensor, slot: _Slot, write_view: bool) -> None:
        """Adopt ``slot``; ``write_view``: put its quantized view into ``p`` (a restored
        state leaves ``p`` alone: the model's own state dict holds the view it saved)."""
        self._slots[p] = slot
        self.state[p] = slot.light
        if write_view:
            np.copyto(numpy_view(p), slot.engine.quantized_weights.reshape(p.shape))

    def _indexed(self) -> Iterable[tuple[int, int, dict, torch.Tensor]]:
        i = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                yield i, gi, group, p
                i += 1

    # ---- state import / export ---------------------------------------------------------

    def _import(self, i: int, gi: int, group: dict, p: torch.Tensor, state: dict) -> _Slot:
        where = f"{_NAME}: parameter {i}"
        if not isinstance(state, dict):
            raise TypeError(f"{where}: expected a dict of state, got {type(state).__name__}")
        missing = {"step", "master", "exp_avg", "exp_avg_sq"} - set(state)
        if missing:
            raise ValueError(f"{where}: state lacks {sorted(missing)}")
        arrays = {}
        for k in ("master", "exp_avg", "exp_avg_sq"):
            t = state[k]
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{where}: state[{k!r}]: expected a float tensor")
            if t.shape != p.shape:
                raise ValueError(
                    f"{where}: state[{k!r}]: expected shape {tuple(p.shape)}, got {tuple(t.shape)}"
                )
            arrays[k] = t.detach().cpu().to(torch.float32).contiguous()
        s = state["step"]
        step = float(s.item() if isinstance(s, torch.Tensor) else s)
        if not (step >= 0 and step == int(step)):
            raise ValueError(f"{where}: state['step']: expected a whole number >= 0, got {step}")
        hyper = adam_hyper(_NAME, gi, group)
        master = arrays["master"].clone()
        slot = self._new_slot(i, group, hyper, self._config(gi, group, hyper), master)
        raw = _qat_state.patch(
            slot.engine.to_bytes(),
            step=int(step),
            m=arrays["exp_avg"].numpy(),
            v=arrays["exp_avg_sq"].numpy(),
        )
        try:
            slot.engine = _core.QatOptimizer.from_bytes(raw, tuple(p.shape))
        except (_core.QuantError, ValueError) as e:
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

    def _import_pending(self) -> None:
        fresh = {}
        for i, gi, group, p in self._indexed():
            st = self.state.get(p)
            slot = self._slots.get(p)
            if not st or (slot is not None and st is slot.light):
                continue
            fresh[p] = self._import(i, gi, group, p, st)
        for p, slot in fresh.items():
            self._install(p, slot, write_view=False)

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
        fresh = {}
        i = 0
        for gi, (g, s) in enumerate(zip(groups, saved_groups)):
            merged = {**g, **{k: v for k, v in s.items() if k != "params"}}
            for pid in s["params"]:
                st = state_dict.get("state", {}).get(pid)
                if st:
                    fresh[id_map[pid]] = self._import(i, gi, merged, id_map[pid], st)
                i += 1
        super().load_state_dict(state_dict)
        for p, slot in fresh.items():
            self._install(p, slot, write_view=False)

    # ---- the step ----------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._import_pending()
        work = []
        hypers: dict[int, tuple] = {}
        for i, gi, group, p in self._indexed():
            if p.grad is None:
                continue
            check_param(_NAME, i, p)
            g = check_grad(_NAME, i, p, p.grad)
            if gi not in hypers:
                hypers[gi] = adam_hyper(_NAME, gi, group)
                self._config(gi, group, hypers[gi])
            slot = self._slots[p]
            if slot.quant != self._quant_of(group):
                raise ValueError(
                    f"{_NAME}: param_groups[{gi}]: target, scheme, rounding and seed cannot "
                    f"change once parameter {i} has state"
                )
            work.append((i, p, g, slot, hypers[gi]))
        for i, p, g, slot, hyper in work:
            if slot.hyper != hyper:
                raw = _qat_state.patch(slot.engine.to_bytes(), hyper=hyper)
                slot.engine = _core.QatOptimizer.from_bytes(raw, tuple(p.shape))
                slot.hyper = hyper
            try:
                slot.engine.step(numpy_view(slot.master), numpy_view(g))
            except (_core.QuantError, TypeError, ValueError) as e:
                raise type(e)(f"{_NAME}: parameter {i}: {e}") from None
            np.copyto(numpy_view(p), slot.engine.quantized_weights.reshape(p.shape))
            slot.sync_light()
        return loss

    def state_bytes(self) -> int:
        """Bytes of optimizer state: masters and the engines' moments and views."""
        return sum(4 * 4 * s.master.numel() for s in self._slots.values())
