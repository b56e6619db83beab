"""Float32 NumPy Adam / AdamW: the oracle of ``quantrs.Adam4bit`` / ``AdamW4bit``.

Same step math (SPEC section 6): with ``t = step + 1``,
``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
``w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``; AdamW also
subtracts ``lr * wd * w`` (weight before the step, as PyTorch), Adam adds
``wd * w`` to the gradient. Everything stays float32.

``decode_moments`` reads the 4-bit state back out of a ``state_dict`` (codes,
block scales, double-quantized scales, rank-1 statistics) independently of the
Rust code, so tests can compare the quantized moments with float32 ones.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = [
    "CONVERGENCE_SETTINGS",
    "CONVERGENCE_TASKS",
    "NF4_VALUES",
    "AdamWReference",
    "adam_step",
    "cosine_lr",
    "decode_moments",
    "train",
    "variance_table",
]

NF4_VALUES = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)


def _dynamic8() -> np.ndarray:
    vals = [0.0, 1.0]
    for i in range(7):
        edges = np.linspace(0.1, 1.0, 2**i + 1)
        mids = (edges[:-1] + edges[1:]) / 2 * 10.0 ** (i - 6)
        vals += list(mids) + list(-mids)
    return np.sort(np.array(vals)).astype(np.float32)


M_TABLES = {
    "nf4": NF4_VALUES,
    "int4": np.concatenate([[-1.0], np.arange(-7, 8) / 7]).astype(np.float32),
    "dynamic": np.array(
        [-0.8875, -0.6625, -0.4375, -0.2125, -0.0775, -0.0325, -0.0055, 0.0]
        + [0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875, 1.0],
        np.float32,
    ),
    "int8": _dynamic8(),
}


def variance_table(name: str) -> tuple[np.ndarray, bool]:
    """The 16 values of a v map and whether it applies to sqrt(v)."""
    if name in ("linear", "sqrt_linear"):
        t = np.arange(1, 17) / 16
    elif name == "log":
        t = 10.0 ** (-4 * (15 - np.arange(16)) / 15)
    elif name == "sqrt_log":
        t = 10.0 ** (-2 * (15 - np.arange(16)) / 15)
    else:
        raise ValueError(name)
    return t.astype(np.float32), name.startswith("sqrt")


def adam_step(w, g, m, v, t, lr, b1, b2, eps, wd, decoupled=True):
    """One float32 step in place on ``w``, ``m``, ``v`` (``t`` counts from 1)."""
    f = np.float32
    g = g.astype(np.float32)
    if not decoupled and wd:
        g = g + f(wd) * w
    m *= f(b1)
    m += f(1 - f(b1)) * g
    v *= f(b2)
    v += f(1 - f(b2)) * (g * g)
    bc1 = f(1 - f(b1) ** t)
    bc2 = f(1 - f(b2) ** t)
    upd = f(lr) * (m / bc1) / (np.sqrt(v / bc2) + f(eps))
    if decoupled and wd:
        w -= f(lr * wd) * w
    w -= upd


class AdamWReference:
    """Float32 Adam (``decoupled=False``) / AdamW with the quantrs call pattern."""

    def __init__(
        self,
        learning_rate=1e-3,
        beta1=0.9,
        beta2=0.999,
        epsilon=1e-8,
        weight_decay=0.0,
        *,
        decoupled=True,
    ):
        self.lr, self.b1, self.b2 = learning_rate, beta1, beta2
        self.eps, self.wd, self.decoupled = epsilon, weight_decay, decoupled
        self.t = 0
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def update(self, param, grad, *, name):
        if name not in self.m:
            self.m[name] = np.zeros(param.shape, np.float32)
            self.v[name] = np.zeros(param.shape, np.float32)
        adam_step(
            param,
            np.asarray(grad, np.float32),
            self.m[name],
            self.v[name],
            self.t + 1,
            self.lr,
            self.b1,
            self.b2,
            self.eps,
            self.wd,
            self.decoupled,
        )

    def step(self):
        self.t += 1

    def set_lr(self, lr):
        self.lr = lr

    def state_bytes(self) -> int:
        return sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values())


def _block_scales(sd, key, which, nblocks):
    if f"{key}/{which}_scales" in sd:
        return sd[f"{key}/{which}_scales"].astype(np.float32)
    codes = sd[f"{key}/{which}_scale_codes"]
    groups = sd[f"{key}/{which}_scale_groups"].astype(np.float32)
    out = np.zeros(nblocks, np.float32)
    for gi in range(groups.shape[0]):
        mx, step = groups[gi].astype(np.float64)
        c = codes[gi * 256 : (gi + 1) * 256]
        # s(c) = max * 2^(c * step), step = log2(min / max) / 254; code 255 = all-zero block.
        s = (mx * np.exp2(c.astype(np.float64) * step)).astype(np.float32)
        out[gi * 256 : gi * 256 + len(c)] = np.where(c == 255, 0.0, s)
    return out


def _nibbles(codes, n):
    out = np.empty(2 * len(codes), np.uint8)
    out[0::2] = codes & 15
    out[1::2] = codes >> 4
    return out[:n]


def decode_moments(state_dict, key):
    """Decoded (m, v) of parameter ``key`` of a ``state_dict``, float32, flat."""
    meta = json.loads(bytes(state_dict["meta"]).decode())
    shape = meta["params"][key]
    n = int(np.prod(shape))
    bs = meta["block_size"]
    nb = -(-n // bs)
    method = meta["method"]
    mc = state_dict[f"{key}/m_codes"]
    mcodes = mc[:n] if method == "int8" else _nibbles(mc, n)
    ms = np.repeat(_block_scales(state_dict, key, "m", nb), bs)[:n]
    m = M_TABLES[method][mcodes] * ms
    vt, sqrt_domain = variance_table(meta["variance_map"])
    vcodes = _nibbles(state_dict[f"{key}/v_codes"], n)
    if f"{key}/v_rank1_rows" in state_dict:
        r = state_dict[f"{key}/v_rank1_rows"]
        c = state_dict[f"{key}/v_rank1_cols"]
        vs = np.minimum(r[:, None], c[None, :]).reshape(-1)
    else:
        vs = np.repeat(_block_scales(state_dict, key, "v", nb), bs)[:n]
    u = vt[vcodes] * vs
    v = u * u if sqrt_domain else u
    return m.astype(np.float32), v.astype(np.float32)


# --- the convergence suite (SPEC section 6): small NumPy tasks with exact gradients ---------


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
#: AdamW has converged (the comparison is of converged losses, SPEC section 6).
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
