"""Training loop, optimizers under test, and the summary numbers of a run.

An optimizer here is anything with ``update(param, grad, *, name)``, ``set_lr(lr)`` and
``step()`` (the ``AdamW4bit`` call pattern). ``Split`` sends 1-D parameters (biases) to a
float32 AdamW and the rest to the optimizer under test, as torchao and bitsandbytes do
with small tensors.
"""

from __future__ import annotations

import time

import numpy as np

from quantrs.reference.optim import AdamWReference

#: Window of the final loss: the mean of the last this-many per-step losses.
FINAL_WINDOW = 100


def lr_at(task, i: int, steps: int) -> float:
    if task.schedule == "constant":
        return task.lr
    return task.lr * 0.5 * (1 + np.cos(np.pi * i / steps))


class Split:
    """1-D parameters on float32 AdamW, the others on ``inner``."""

    def __init__(self, inner, lr, weight_decay):
        self.inner = inner
        self.small = AdamWReference(lr, weight_decay=weight_decay)

    def update(self, param, grad, *, name):
        (self.small if param.ndim < 2 else self.inner).update(param, grad, name=name)

    def set_lr(self, lr):
        self.inner.set_lr(lr)
        self.small.set_lr(lr)

    def step(self):
        self.inner.step()
        self.small.step()


class TorchAdamW:
    """``torch.optim.AdamW`` over NumPy parameters (shared memory, float32, CPU)."""

    def __init__(self, lr, weight_decay):
        import torch

        self.torch = torch
        self.lr, self.wd = lr, weight_decay
        self.params: dict[str, object] = {}
        self.opt = None

    def update(self, param, grad, *, name):
        t = self.params.get(name)
        if t is None:
            t = self.torch.from_numpy(param)  # shares the NumPy buffer
            t.grad = self.torch.zeros_like(t)
            self.params[name] = t
            self.opt = self.torch.optim.AdamW(
                list(self.params.values()), lr=self.lr, weight_decay=self.wd, foreach=False
            )
        t.grad.copy_(self.torch.from_numpy(np.ascontiguousarray(grad, np.float32)))

    def set_lr(self, lr):
        self.lr = lr
        if self.opt is not None:
            for g in self.opt.param_groups:
                g["lr"] = lr

    def step(self):
        with self.torch.no_grad():
            self.opt.step()


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def make_optimizer(variant: str, task, **quant):
    """``"float32"`` (NumPy reference AdamW), ``"torch"`` (``torch.optim.AdamW``), or
    ``"4bit"`` (``quantrs.AdamW4bit`` with ``AdvancedQuantizationConfig(**quant)`` on 2-D
    parameters, float32 AdamW on 1-D ones)."""
    lr, wd = task.lr, task.weight_decay
    if variant == "float32":
        return AdamWReference(lr, weight_decay=wd)
    if variant == "torch":
        return TorchAdamW(lr, wd)
    if variant == "4bit":
        import quantrs

        q = quantrs.AdvancedQuantizationConfig(**quant)
        o = quantrs.Adam4bitOptimizerConfig(lr, weight_decay=wd)
        return Split(quantrs.AdamW4bit.with_quantization_config(o, q), lr, wd)
    raise ValueError(f"variant: expected 'float32', 'torch' or '4bit', got {variant!r}")


def train(task, opt, steps: int | None = None):
    """Run ``task`` with ``opt``; returns ``(per-step losses, test metric, seconds)``.
    The task's schedule is set through ``opt.set_lr`` before each step."""
    steps = task.steps if steps is None else steps
    p = task.init()
    curve = np.empty(steps)
    t0 = time.perf_counter()
    for i, idx in enumerate(task.batches(steps)):
        opt.set_lr(lr_at(task, i, steps))
        loss, g = task.loss_grad(p, idx)
        curve[i] = loss
        for k in p:
            opt.update(p[k], np.ascontiguousarray(g[k], np.float32), name=k)
        opt.step()
    return curve, task.evaluate(p), time.perf_counter() - t0


def final_loss(curve) -> float:
    return float(np.mean(curve[-FINAL_WINDOW:]))


def worst_gap(curve, base, window: int = FINAL_WINDOW) -> float:
    """Largest relative excess of ``curve`` over ``base``, comparing means of consecutive
    ``window``-step windows (per-step mini-batch losses are too noisy to compare)."""
    n = (min(len(curve), len(base)) // window) * window
    a = np.asarray(curve[:n]).reshape(-1, window).mean(1)
    b = np.asarray(base[:n]).reshape(-1, window).mean(1)
    return float(np.max(a / b - 1))
