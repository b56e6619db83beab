"""What the torch optimizers share: one Rust engine per parameter behind a light
``optimizer.state[p]``, the parameter walk, ``step`` and the state-dict round trip.

A subclass keeps a *slot* per parameter (its engine and whatever it needs); between steps
``self.state[p]`` is ``slot.light``, a small dict (``{"step": tensor}``, plus the master
for ``QatAdamW``). ``state_dict()`` swaps in the full per-parameter state (``_export``),
``load_state_dict()`` builds and checks every slot before anything changes (``_import``),
and a state placed in ``self.state[p]`` from outside (as ``ZeroRedundancyOptimizer`` and
``torch.distributed.checkpoint.set_state_dict`` do) is adopted at the next ``step()`` /
``state_dict()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any, Callable, ClassVar

import torch
from torch.optim import Optimizer

from .._core import InvalidArgument
from ._checks import adam_hyper, check_grad, check_param
from ._dtensor import local_view


class SlotOptimizer(Optimizer):
    """``torch.optim.Optimizer`` over per-parameter slots (see the module docstring).

    Subclasses set ``_name``, construct through ``_start`` and implement ``_import``,
    ``_export``, ``_check_fixed`` and ``_update``.
    """

    _name: ClassVar[str]
    # True where the engine has a device twin (quantrs.cuda): CUDA parameters are taken.
    _has_device_engine: ClassVar[bool] = False
    # True where DTensor parameters are stepped through their local shard (_dtensor.py);
    # the hooks then see the DTensor as the slot key and call ``_local`` for its values.
    _takes_dtensor: ClassVar[bool] = False
    _slots: dict[torch.Tensor, Any]

    def _start(
        self,
        params: Iterable[Any],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        **settings: Any,
    ) -> None:
        """``Optimizer.__init__`` with the Adam hyper-parameters and the subclass's
        ``settings`` as the group defaults, and no slots yet."""
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        self._slots = {}
        super().__init__(params, {**defaults, **settings})

    # ---- hooks -------------------------------------------------------------------------

    def _import(self, i: int, gi: int, group: dict, p: torch.Tensor, state: dict) -> Any:
        """A new slot holding the torch per-parameter ``state``, fully checked."""
        raise NotImplementedError

    def _export(self, slot: Any) -> dict[str, torch.Tensor]:
        """The torch per-parameter state of ``slot``."""
        raise NotImplementedError

    def _check_fixed(self, i: int, gi: int, group: dict, p: torch.Tensor) -> None:
        """Raise if ``group`` changed a setting that cannot change once ``p`` has state."""
        raise NotImplementedError

    def _update(
        self, i: int, gi: int, group: dict, p: torch.Tensor, g: torch.Tensor, hyper: tuple
    ) -> None:
        """One step of parameter ``i`` (every input already checked)."""
        raise NotImplementedError

    def _group_hyper(self, gi: int, group: dict) -> tuple:
        """The group's ``(lr, beta1, beta2, eps, weight_decay)``, checked."""
        return adam_hyper(self._name, gi, group)

    def _local(self, i: int, p: torch.Tensor) -> torch.Tensor:
        """The tensor the engine updates: ``p``, or its local shard where DTensors are
        taken (a plain tensor of another kind is refused by ``check_param``)."""
        if not self._takes_dtensor:
            return p
        memo = self._step_locals
        if memo is None:
            return local_view(f"{self._name}: parameter {i}", p)
        # During a step each tensor's shard is looked up several times (checks, views,
        # write-back): the placement check and ``to_local`` run once.
        local = memo.get(id(p))
        if local is None:
            local = memo[id(p)] = local_view(f"{self._name}: parameter {i}", p)
        return local

    def _adopt(self, p: torch.Tensor, slot: Any) -> None:
        self._slots[p] = slot
        self.state[p] = slot.light

    def _adopt_loaded(self, fresh: dict[torch.Tensor, Any]) -> None:
        """Take the slots built by ``load_state_dict`` (after torch's own load)."""
        for p, slot in fresh.items():
            self._adopt(p, slot)

    # ---- the walk ----------------------------------------------------------------------

    def _indexed(self) -> Iterable[tuple[int, int, dict, torch.Tensor]]:
        """``(param index, group index, group, param)`` in state-dict order."""
        i = 0
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                yield i, gi, group, p
                i += 1

    def _import_pending(self) -> None:
        """Adopt states placed in ``self.state`` from outside (all checked first)."""
        fresh = {}
        for i, gi, group, p in self._indexed():
            st = self.state.get(p)
            slot = self._slots.get(p)
            if not st or (slot is not None and st is slot.light):
                continue  # nothing there, an empty dict, or our own light state
            fresh[p] = self._import(i, gi, group, p, st)
        for p, slot in fresh.items():
            self._adopt(p, slot)

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
            raise InvalidArgument(
                "state_dict: loaded state dict has a different number of parameter groups"
            )
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise InvalidArgument(
                "state_dict: loaded state dict contains a parameter group that doesn't match "
                "the size of optimizer's group"
            )
        id_map = dict(
            zip(
                chain.from_iterable(s["params"] for s in saved_groups),
                chain.from_iterable(g["params"] for g in groups),
            )
        )
        # Validate and build every slot first: a bad state changes nothing.
        fresh = {}
        i = 0
        for gi, (g, s) in enumerate(zip(groups, saved_groups)):
            merged = {**g, **{k: v for k, v in s.items() if k != "params"}}
            for pid in s["params"]:
                st = state_dict.get("state", {}).get(pid)
                p = id_map[pid]
                local = self._local(i, p)
                if st:
                    if local is p or local.numel() > 0:
                        check_param(self._name, i, local, cuda=self._has_device_engine)
                    fresh[p] = self._import(i, gi, merged, p, st)
                i += 1
        super().load_state_dict(state_dict)
        self._adopt_loaded(fresh)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._import_pending()
        self._step_locals = {}
        try:
            self._checked_step()
        finally:
            self._step_locals = None
        return loss

    # The local shards of the tensors a step has looked up, by ``id`` (``_local``); None
    # outside a step.
    _step_locals: dict[int, torch.Tensor] | None = None

    def _checked_step(self) -> None:
        # Check everything first: a bad parameter, gradient or group changes nothing.
        work = []
        hypers: dict[int, tuple] = {}
        for i, gi, group, p in self._indexed():
            if p.grad is None:
                continue
            local = self._local(i, p)
            # A rank may hold no rows of a DTensor: it still keeps the (empty) state and
            # the step count, so every rank's state dict has the same entries.
            if local is p or local.numel() > 0:
                check_param(self._name, i, local, cuda=self._has_device_engine)
            finite = not (self._engine_checks_cpu_grads and local.device.type == "cpu")
            g = check_grad(self._name, i, local, self._local(i, p.grad), finite=finite)
            if gi not in hypers:
                hypers[gi] = self._group_hyper(gi, group)
            self._check_fixed(i, gi, group, p)
            work.append((i, gi, group, p, g))
        self._update_all(work, hypers)

    # True where ``_update_all`` checks the values of the CPU gradients before it updates
    # any parameter (so ``step`` skips its own summing pass over them).
    _engine_checks_cpu_grads = False

    def _update_all(self, work: list[tuple], hypers: dict[int, tuple]) -> None:
        """Update every checked ``(i, gi, group, p, g)`` of ``work``."""
        for i, gi, group, p, g in work:
            self._update(i, gi, group, p, g, hypers[gi])
