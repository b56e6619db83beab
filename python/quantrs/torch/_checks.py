"""Checks shared by the torch optimizers: every bad input raises before anything changes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .._core import CudaNotAvailable, InvalidArgument
from . import _cuda
from ._dtensor import is_dtensor


def check_param(owner: str, index: int, p: torch.Tensor, *, cuda: bool = False) -> None:
    """A parameter the Rust kernels can update in place: through a NumPy view on the
    CPU, through DLPack on a CUDA device where the optimizer has a device engine
    (``cuda=True``; docs/gpu.md)."""
    where = f"{owner}: parameter {index}"
    if is_dtensor(p):
        raise TypeError(
            f"{where} is a DTensor (FSDP2 / tensor parallel): {owner} takes plain tensors; "
            "AdamW4bit and Adam4bit take DTensors (docs/torch.md)"
        )
    if p.device.type == "cuda":
        if not cuda:
            raise CudaNotAvailable(f"{where} is on {p.device}: {owner} runs on the CPU only")
        _cuda.require(where, p.device)
    elif p.device.type != "cpu":
        raise InvalidArgument(f"{where}: expected a CPU or CUDA tensor, got device {p.device}")
    if p.dtype != torch.float32:
        raise TypeError(f"{where}: expected dtype torch.float32, got {p.dtype}")
    if p.is_sparse or p.layout != torch.strided:
        raise TypeError(f"{where}: expected a dense (strided) tensor, got layout {p.layout}")
    if not p.is_contiguous():
        raise InvalidArgument(f"{where}: expected a contiguous tensor (the update runs in place)")
    if p.numel() == 0:
        raise InvalidArgument(f"{where}: expected at least one element, got shape {tuple(p.shape)}")


def check_grad(
    owner: str, index: int, p: torch.Tensor, g: torch.Tensor, *, finite: bool = True
) -> torch.Tensor:
    """The gradient of ``p`` as a dense contiguous float32 tensor on ``p``'s device (a copy
    only when it is not contiguous); ``finite=False`` leaves the check of its values to an
    engine that checks every gradient of the step before it updates any."""
    where = f"{owner}: parameter {index}"
    if g.is_sparse or g.layout != torch.strided:
        raise TypeError(f"{where}: sparse gradients are not supported (layout {g.layout})")
    if g.is_complex() or g.dtype != torch.float32:
        raise TypeError(f"{where}: expected a torch.float32 gradient, got {g.dtype}")
    if g.device != p.device:
        raise InvalidArgument(
            f"{where}: the gradient is on {g.device} but the parameter is on {p.device}"
        )
    if g.shape != p.shape:
        raise InvalidArgument(
            f"{where}: gradient shape {tuple(g.shape)} does not match the parameter's "
            f"{tuple(p.shape)}"
        )
    g = g.detach().contiguous()
    # One summing pass finds any NaN or inf (a finite sum that overflows is checked
    # element by element): the Rust kernel would refuse it too, but only after the
    # parameters before this one had been updated.
    if finite and not torch.isfinite(g.sum()) and not bool(torch.isfinite(g).all()):
        bad = int((~torch.isfinite(g)).flatten().nonzero()[0])
        raise InvalidArgument(
            f"{where}: the gradient has a non-finite value {float(g.flatten()[bad])} at flat "
            f"index {bad}"
        )
    return g


def as_float(owner: str, group: int, key: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise InvalidArgument(f"{owner}: param_groups[{group}][{key!r}]: expected one number")
        value = value.item()
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{owner}: param_groups[{group}][{key!r}]: expected a number, got {value!r}"
        ) from None
    if not math.isfinite(x):
        raise InvalidArgument(f"{owner}: param_groups[{group}][{key!r}]: expected finite, got {x}")
    return x


_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = 2.0**-149  # the smallest float32 above 0


def adam_hyper(owner: str, gi: int, group: dict) -> tuple[float, float, float, float, float]:
    """``(lr, beta1, beta2, eps, weight_decay)`` of one group, checked like torch.optim."""
    lr = as_float(owner, gi, "lr", group["lr"])
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise InvalidArgument(f"{owner}: param_groups[{gi}]['betas']: expected two numbers")
    b1 = as_float(owner, gi, "betas", betas[0])
    b2 = as_float(owner, gi, "betas", betas[1])
    eps = as_float(owner, gi, "eps", group["eps"])
    wd = as_float(owner, gi, "weight_decay", group["weight_decay"])
    if lr < 0:
        raise InvalidArgument(f"{owner}: param_groups[{gi}]['lr']: expected >= 0, got {lr}")
    for k, b in (("betas[0]", b1), ("betas[1]", b2)):
        if not 0.0 <= b < 1.0:
            raise InvalidArgument(f"{owner}: param_groups[{gi}][{k}]: expected in [0, 1), got {b}")
    if eps <= 0:
        raise InvalidArgument(f"{owner}: param_groups[{gi}]['eps']: expected > 0, got {eps}")
    if wd < 0:
        raise InvalidArgument(
            f"{owner}: param_groups[{gi}]['weight_decay']: expected >= 0, got {wd}"
        )
    # The engines hold float32 hyper-parameters: a value that overflows float32 (or an eps
    # that rounds to 0) would be refused by the engine of some parameter in the middle of
    # a step, after others had moved; refuse it here, before anything changes.
    for k, x in (("lr", lr), ("eps", eps), ("weight_decay", wd)):
        if x > _F32_MAX or (k == "eps" and x < _F32_TINY):
            raise InvalidArgument(
                f"{owner}: param_groups[{gi}][{k!r}]: {x} is not representable in float32"
            )
    return lr, b1, b2, eps, wd


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A NumPy array sharing ``t``'s memory (``t`` dense, contiguous, on the CPU)."""
    return t.detach().numpy()
