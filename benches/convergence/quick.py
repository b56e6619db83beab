"""The fast convergence tasks (least squares, logistic regression, a small MLP) and their
cosine-schedule training loop, used by ``tests/python/test_optim_convergence.py`` and
``benches/bench_optim.py``; they stop early, so they check that every state variant
trains, not how close it comes at a low loss (that is ``run.py``'s suite).
"""

from __future__ import annotations

import numpy as np

from quantrs.reference.optim import AdamWReference

__all__ = ["CONVERGENCE_SETTINGS", "CONVERGENCE_TASKS", "AdamWReference", "cosine_lr", "train"]


class _Task:
    """A model with float32 parameters, a loss and its gradients."""

    name = ""

    def init(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def loss_grad(self, p, idx=None):
        raise NotImplementedError

    def batches(self, steps, seed=2):
        return [None] * steps


class LeastSquares(_Task):
    name = "least_squares"

    def __init__(self, n=512, d=48, seed=0):
        rng = np.random.default_rng(seed)
        self.X = rng.standard_normal((n, d)).astype(np.float32)
        w = rng.standard_normal(d).astype(np.float32)
        self.y = (self.X @ w + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def init(self):
        d = self.X.shape[1]
        return {"w": np.zeros(d, np.float32), "b": np.zeros(1, np.float32)}

    def loss_grad(self, p, idx=None):
        r = self.X @ p["w"] + p["b"] - self.y
        n = np.float32(len(r))
        return float(np.mean(r * r)), {"w": 2 * self.X.T @ r / n, "b": np.array([2 * r.sum() / n])}


class LogisticRegression(_Task):
    name = "logistic_regression"

    def __init__(self, n=1024, d=32, seed=0):
        rng = np.random.default_rng(seed)
        self.X = rng.standard_normal((n, d)).astype(np.float32)
        w = rng.standard_normal(d) * 0.7
        self.y = (self.X @ w + 2.0 * rng.standard_normal(n) > 0).astype(np.float32)

    def init(self):
        d = self.X.shape[1]
        return {"w": np.zeros(d, np.float32), "b": np.zeros(1, np.float32)}

    def loss_grad(self, p, idx=None):
        z = self.X @ p["w"] + p["b"]
        pr = 1 / (1 + np.exp(-z))
        loss = np.mean(np.logaddexp(0, z) - self.y * z)
        dz = (pr - self.y) / np.float32(len(z))
        return float(loss), {"w": self.X.T @ dz, "b": np.array([dz.sum()])}


class MLP(_Task):
    """Two-layer ReLU classifier on Gaussian clusters, mini-batches of 64."""

    name = "mlp"

    def __init__(self, n=2048, d=16, h=64, k=4, seed=0):
        rng = np.random.default_rng(seed)
        centers = rng.standard_normal((k, d)) * 0.6
        self.y = rng.integers(0, k, n)
        self.X = (centers[self.y] + rng.standard_normal((n, d))).astype(np.float32)
        self.d, self.h, self.k = d, h, k

    def init(self):
        rng = np.random.default_rng(1)
        d, h, k = self.d, self.h, self.k
        return {
            "W1": (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32),
            "b1": np.zeros(h, np.float32),
            "W2": (rng.standard_normal((h, k)) / np.sqrt(h)).astype(np.float32),
            "b2": np.zeros(k, np.float32),
        }

    def batches(self, steps, seed=2):
        rng = np.random.default_rng(seed)
        return [rng.integers(0, len(self.y), 64) for _ in range(steps)]

    def loss_grad(self, p, idx=None):
        X, y = (self.X, self.y) if idx is None else (self.X[idx], self.y[idx])
        H = np.maximum(X @ p["W1"] + p["b1"], 0)
        Z = H @ p["W2"] + p["b2"]
        Z = Z - Z.max(1, keepdims=True)
        P = np.exp(Z)
        P /= P.sum(1, keepdims=True)
        rows = np.arange(len(y))
        loss = -np.log(P[rows, y] + 1e-12).mean()
        dZ = P
        dZ[rows, y] -= 1
        dZ /= np.float32(len(y))
        dH = (dZ @ p["W2"].T) * (H > 0)
        return float(loss), {"W1": X.T @ dH, "b1": dH.sum(0), "W2": H.T @ dZ, "b2": dZ.sum(0)}


CONVERGENCE_TASKS = {t.name: t for t in (LeastSquares, LogisticRegression, MLP)}
#: (steps, peak learning rate) per task, cosine-decayed to 0: long enough that float32
#: AdamW has converged (the comparison is of converged losses).
CONVERGENCE_SETTINGS = {
    "least_squares": (1000, 3e-2),
    "logistic_regression": (800, 3e-2),
    "mlp": (600, 3e-3),
}


def cosine_lr(peak: float, i: int, steps: int) -> float:
    return peak * 0.5 * (1 + np.cos(np.pi * i / steps))


def train(task: _Task, opt, steps: int, lr: float, curve: list | None = None) -> float:
    """Train ``task`` with ``opt`` (``update(param, grad, name=)``, ``set_lr``, ``step()``)
    on a cosine schedule from ``lr``; returns the final full-data loss. Appends each
    step's (mini-batch) loss to ``curve`` when given."""
    p = task.init()
    for i, idx in enumerate(task.batches(steps)):
        opt.set_lr(cosine_lr(lr, i, steps))
        loss, g = task.loss_grad(p, idx)
        if curve is not None:
            curve.append(loss)
        for k in p:
            opt.update(p[k], np.ascontiguousarray(g[k], np.float32), name=k)
        opt.step()
    return task.loss_grad(p)[0]
