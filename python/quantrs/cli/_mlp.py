"""The demo's model and data: a 64-H-10 ReLU MLP in NumPy and the embedded digits.

Everything is float32 and deterministic for a given seed. The float32 AdamW here is
the textbook update (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
2019, in PyTorch's order: decay on the old weight, then the bias-corrected step);
it is the baseline the quantrs optimizers are compared with.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

F32 = np.float32


def load_digits(split_seed: int = 0, test_fraction: float = 0.2):
    """``(x_train, y_train, x_test, y_test)``: the 1,797 8x8 digits in ``quantrs/data``,
    pixels scaled to [0, 1], split by a fixed stratified permutation (same test set for
    every ``--seed``, so runs with different seeds are comparable)."""
    with resources.files("quantrs").joinpath("data/digits.npz").open("rb") as f:
        d = np.load(f)
        x, y = d["X"].astype(F32) / F32(16), d["y"].astype(np.int64)
    rng = np.random.default_rng(split_seed)
    test = np.zeros(len(y), bool)
    for c in range(10):
        idx = np.flatnonzero(y == c)
        test[rng.permutation(idx)[: round(len(idx) * test_fraction)]] = True
    return x[~test], y[~test], x[test], y[test]


def init_params(hidden: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-normal weights, zero biases; ``W`` is ``[in, out]`` (``y = x @ W + b``)."""

    def he(fan_in: int, fan_out: int) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(F32)

    return {
        "W1": he(64, hidden),
        "b1": np.zeros(hidden, F32),
        "W2": he(hidden, 10),
        "b2": np.zeros(10, F32),
    }


def softmax_xent(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(p[np.arange(n), y] + 1e-12).mean())
    p[np.arange(n), y] -= 1
    return loss, (p / F32(n)).astype(F32)


def forward(w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w["W1"] + w["b1"], 0) @ w["W2"] + w["b2"]


def loss_and_grads(w: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray):
    """Loss and gradients with respect to the weights used in the forward pass."""
    pre = x @ w["W1"] + w["b1"]
    h = np.maximum(pre, 0)
    loss, dlogits = softmax_xent(h @ w["W2"] + w["b2"], y)
    dh = (dlogits @ w["W2"].T) * (pre > 0)
    grads = {
        "W2": h.T @ dlogits,
        "b2": dlogits.sum(axis=0),
        "W1": x.T @ dh,
        "b1": dh.sum(axis=0),
    }
    return loss, {k: g.astype(F32, copy=False) for k, g in grads.items()}


def evaluate(logits: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy in %)``."""
    loss, _ = softmax_xent(logits, y)
    return loss, float((logits.argmax(axis=1) == y).mean() * 100)


class AdamW:
    """float32 AdamW in plain NumPy, one ``m``/``v`` pair per parameter name."""

    def __init__(self, lr: float, weight_decay: float, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, beta1, beta2, eps
        self.t = 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def update(self, name: str, p: np.ndarray, g: np.ndarray) -> None:
        """Update ``p`` in place with the step ``t + 1``; call :meth:`step` after all."""
        m = self.m.setdefault(name, np.zeros_like(p))
        v = self.v.setdefault(name, np.zeros_like(p))
        t = self.t + 1
        m *= F32(self.b1)
        m += F32(1 - self.b1) * g
        v *= F32(self.b2)
        v += F32(1 - self.b2) * (g * g)
        mhat = m / F32(1 - self.b1**t)
        vhat = v / F32(1 - self.b2**t)
        p -= F32(self.lr * self.wd) * p
        p -= F32(self.lr) * mhat / (np.sqrt(vhat) + F32(self.eps))

    def step(self) -> None:
        self.t += 1

    def state_bytes(self) -> int:
        return sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values())
