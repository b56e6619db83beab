"""Float32 NumPy Adam / AdamW: the oracle of ``quantrs.Adam4bit`` / ``AdamW4bit``.

Same step math (docs/optim.md, "Step math"): with ``t = step + 1``,
``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
``w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``; AdamW also
subtracts ``lr * wd * w`` (weight before the step, as PyTorch), Adam adds
``wd * w`` to the gradient. Everything stays float32.

``decode_moments`` reads the 4-bit state back out of a ``state_dict`` (codes,
block scales, double-quantized scales, rank-1 statistics) independently of the
Rust code, so tests can compare the quantized moments with float32 ones.
``dq_round_v_scales`` models how state format 2 rounds v's double-quantized
block scales (without bias, from a hash of the step and the block).

The convergence suite that used to live here is in ``benches/convergence/``.
"""

from __future__ import annotations

import json

import numpy as np

from .._core import InvalidArgument

__all__ = [
    "NF4_VALUES",
    "AdamWReference",
    "adam_step",
    "decode_moments",
    "dither_uniform",
    "dq_round_v_scales",
    "splitmix64",
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
        raise InvalidArgument(
            "name: expected a variance map, 'linear', 'log', 'sqrt_linear' or 'sqrt_log', "
            f"got {name!r}"
        )
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


# --- state format 2: unbiased rounding of v's double-quantized block scales ---------------

_M64 = (1 << 64) - 1


def splitmix64(z):
    """splitmix64's finalizer on Python ints or a uint64 array (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dither_uniform(t: int, numel: int, blocks) -> np.ndarray:
    """The uniform numbers in [0, 1) (24 bits, float32) with which step ``t`` (1-based)
    rounds the v scales of ``blocks`` (indices within the parameter) of a parameter of
    ``numel`` elements."""
    key = splitmix64(((t * 0x9E3779B97F4A7C15) & _M64) ^ numel)
    z = splitmix64(key ^ np.asarray(blocks, np.uint64))
    return ((z >> np.uint64(40)).astype(np.float64) / 16777216.0).astype(np.float32)


def dq_round_v_scales(x, table, u):
    """Codes of v's block scales ``x`` (float32, one group) on the decoded ``table`` (256
    float32, non-increasing, ``table[255] = 0``) with the uniform numbers ``u``: the
    largest code ``c <= 254`` with ``table[c] >= x`` (format 1), moved to ``c + 1`` when
    ``u * (table[c] - table[c + 1]) < table[c] - x`` in float32, so the decoded scale is
    ``x`` on average; code 255 for ``x == 0``."""
    x = np.asarray(x, np.float32)
    t = np.asarray(table, np.float32)
    up = np.array([np.flatnonzero(t[:255] >= xi).max() if xi > 0 else 255 for xi in x])
    hi = t[np.minimum(up, 254)]
    lo = t[np.minimum(up + 1, 255)]
    gap = (hi - lo).astype(np.float32)
    down = (up < 254) & (gap > 0) & (np.asarray(u, np.float32) * gap < (hi - x).astype(np.float32))
    return np.where(down, up + 1, up).astype(np.uint8)
