"""A NumPy model of the 4-bit AdamW state, for diagnosis: every choice of the format is a
knob (m map, v map, block size, how each moment's block scales are stored and rounded), so
one change can be tried at a time without rebuilding the extension.

It follows the kernel's step (``src/optim/kernel.rs``): decode m and v, the float32 AdamW
element update, per-block absmax of the new m and max of the new ``u`` (v or sqrt(v)),
clamp, store the scales, encode each element to its nearest code. It is not bit-exact with
the extension (the extension's own oracle is ``quantrs.reference.optim.decode_moments``).

Scale formats (``m_scales`` / ``v_scales``):

- ``"f32"``: one float32 per block (``double_quantization=False``);
- ``"dq_up"``: 8-bit codes on a log grid from the group's (256 blocks) max to its smallest
  non-zero scale, rounded *up* (the format up to state version 1);
- ``"dq_nearest"``: the same grid, rounded to the nearest code (in log2);
- ``"dq_stochastic"``: the same grid, rounded up or down at random with the probability
  that makes the decoded scale unbiased (the format of state version 2, whose extension
  draws the random number from a hash of the step and the block instead);
- ``"bf16_up"`` / ``"f16_up"``: one bfloat16 / IEEE half per block, rounded up (a scale
  stored in 2 bytes that needs no pass over a group: the one-pass layout of docs/optim.md;
  the half saturates at 65504);
- ``"bf16_nearest"`` / ``"f16_nearest"``: the same, rounded to nearest even.

Besides the extension's v maps, ``variance_map="sqrt_pow2h"`` is the 16 values
``{1, 0.75, 0.5, 0.375, ...}`` (``2^-k`` and ``1.5 * 2^-k``, down to ``1.5 * 2^-8``) on
``sqrt(v)``: consecutive float32 bit patterns ``2^22`` apart, so a kernel finds the nearest
code from the bits alone (``(bits(x) - bits(1.5 * 2^-8) + 2^21) >> 22``, clamped to 0..15)
instead of searching the midpoints. ``method="pow2h"`` is its signed m twin: a sign bit
and a 3-bit magnitude, ``±{0, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.75, 1}`` (the magnitude's
code from the bits as above, 0 below 0.0625).
"""

from __future__ import annotations

import numpy as np

from quantrs.reference.optim import M_TABLES, variance_table

F = np.float32
GROUP = 256


def _pow2h_table():
    """``sqrt_pow2h``: code ``c`` is the float32 whose bits are ``bits(1.5 * 2^-8) + c * 2^22``."""
    base = np.array([1.5 * 2.0**-8], F).view(np.uint32)[0]
    return (base + np.arange(16, dtype=np.uint32) * np.uint32(1 << 22)).view(F)


def _m_table(method):
    if method == "pow2h":
        mags = np.concatenate([[0.0], _pow2h_table()[-7:]]).astype(F)
        return np.concatenate([-mags[::-1], mags]).astype(F)
    return M_TABLES[method]


def _variance_table(name):
    if name == "sqrt_pow2h":
        return _pow2h_table(), True
    return variance_table(name)


def _nearest(table, x):
    mids = (table[:-1] + table[1:]) / 2
    return np.searchsorted(mids, x, side="left").astype(np.uint8)


def _stochastic(table, x, rng):
    """One of the two codes around ``x``, the upper with probability proportional to the
    distance from the lower (unbiased inside the table's range; saturates outside)."""
    lo = np.clip(np.searchsorted(table, x, side="right") - 1, 0, len(table) - 2)
    t0, t1 = table[lo], table[lo + 1]
    p = np.clip((x - t0) / (t1 - t0), 0, 1)
    return (lo + (rng.random(len(x)) < p)).astype(np.uint8)


def _half_up(s, fmt):
    """``s`` (float32, >= 0) rounded up to the nearest bfloat16 / IEEE half value."""
    if fmt == "bf16":
        bits = s.astype(F).view(np.uint32)
        down = bits & np.uint32(0xFFFF0000)
        up = np.where(bits != down, down + np.uint32(0x10000), down)
        return up.view(F)
    # Saturates at the half's largest value (its elements then clip to the top code).
    h = np.minimum(s, F(65504)).astype(np.float16)
    below = h.astype(F) < np.minimum(s, F(65504))
    h[below] = np.nextafter(h[below], np.float16(np.inf))
    return h.astype(F)


def _half_nearest(s, fmt):
    if fmt == "bf16":
        bits = s.astype(F).view(np.uint32)
        lsb = (bits >> np.uint32(16)) & np.uint32(1)
        return ((bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)).view(F)
    return s.astype(np.float16).astype(F)


HALF = ("bf16_up", "f16_up", "bf16_nearest", "f16_nearest")


class ScaleStore:
    def __init__(self, fmt: str, rng: np.random.Generator):
        if fmt not in ("f32", "dq_up", "dq_nearest", "dq_stochastic", *HALF):
            raise ValueError(fmt)
        self.fmt, self.rng = fmt, rng

    def __call__(self, s):
        """Decoded scales of the (clamped, non-negative) block scales ``s``."""
        if self.fmt == "f32":
            return s
        if self.fmt in HALF:
            kind, rounding = self.fmt.split("_")
            return (_half_up if rounding == "up" else _half_nearest)(s, kind)
        out = np.zeros_like(s)
        for g0 in range(0, len(s), GROUP):
            x = s[g0 : g0 + GROUP].astype(np.float64)
            nz = x > 0
            if not nz.any():
                continue
            mx, mn = x.max(), x[nz].min()
            step = np.log2(mn / mx) / 254 if mn < mx else 0.0
            if step == 0.0:
                out[g0 : g0 + GROUP] = np.where(nz, mx, 0)
                continue
            pos = np.log2(np.where(nz, x, mx) / mx) / step  # fractional code, 0..254
            lo = np.clip(np.floor(pos + 1e-9), 0, 254)  # t[lo] >= x: rounding up
            if self.fmt == "dq_up":
                c = lo
            elif self.fmt == "dq_nearest":
                c = np.clip(np.round(pos), 0, 254)
            else:
                t_lo, t_hi = mx * np.exp2(lo * step), mx * np.exp2((lo + 1) * step)
                p_down = np.where(lo < 254, (t_lo - x) / (t_lo - t_hi), 0.0)
                c = lo + (self.rng.random(len(x)) < p_down)
            out[g0 : g0 + GROUP] = np.where(nz, mx * np.exp2(c * step), 0)
        return out.astype(F)


class SimAdamW4bit:
    """AdamW with block-quantized m and v (``update(param, grad, *, name)``)."""

    def __init__(
        self,
        lr=1e-3,
        weight_decay=0.0,
        *,
        method="nf4",
        variance_map="sqrt_linear",
        block_size=64,
        m_scales="dq_up",
        v_scales="dq_up",
        betas=(0.9, 0.999),
        eps=1e-8,
        min_scale=1e-8,
        max_scale=1e8,
        seed=0,
        exact=(),
        m_elements="nearest",
    ):
        self.lr, self.wd, self.b1, self.b2, self.eps = lr, weight_decay, *betas, eps
        self.mt = _m_table(method)
        self.vt, self.sqrt = _variance_table(variance_map)
        self.bs = block_size
        rng = np.random.default_rng(seed)
        self.m_store, self.v_store = ScaleStore(m_scales, rng), ScaleStore(v_scales, rng)
        self.clamp = (min_scale, max_scale)
        #: moments kept in float32 instead ("m", "v"): isolates the other one's error.
        self.exact = set(exact)
        self.m_elements, self.rng = m_elements, rng
        self.f32: dict[str, list] = {}
        self.t = 0
        self.state: dict[str, list] = {}
        #: per parameter, the float32 v of the same gradients without quantization
        #: (a shadow for diagnosis; it does not affect the step).
        self.shadow_v: dict[str, np.ndarray] = {}

    def set_lr(self, lr):
        self.lr = lr

    def step(self):
        self.t += 1

    def _blocks(self, x, n):
        pad = (-n) % self.bs
        return np.pad(x, (0, pad)).reshape(-1, self.bs)

    def update(self, param, grad, *, name):
        n, bs = param.size, self.bs
        nb = -(-n // bs)
        if name not in self.state:
            zc = np.zeros(nb * bs, np.uint8)
            self.state[name] = [zc.copy(), zc.copy(), np.zeros(nb, F), np.zeros(nb, F)]
            self.shadow_v[name] = np.zeros(n, F)
            self.f32[name] = [np.zeros(n, F), np.zeros(n, F)]
        mc, vc, ms, vs = self.state[name]
        w, g = param.reshape(-1), grad.reshape(-1).astype(F)
        m_hat = (self.mt[mc] * np.repeat(ms, bs))[:n]
        u_hat = (self.vt[vc] * np.repeat(vs, bs))[:n]
        v_hat = u_hat * u_hat if self.sqrt else u_hat
        if "m" in self.exact:
            m_hat = self.f32[name][0]
        if "v" in self.exact:
            v_hat = self.f32[name][1]
        t = self.t + 1
        b1, b2 = F(self.b1), F(self.b2)
        m = b1 * m_hat + (F(1) - b1) * g
        v = b2 * v_hat + (F(1) - b2) * (g * g)
        sv = self.shadow_v[name]
        sv *= b2
        sv += (F(1) - b2) * (g * g)
        r = np.sqrt(v)
        denom = r * F(1 / np.sqrt(1 - self.b2**t)) + F(self.eps)
        step_size = F(self.lr / (1 - self.b1**t))
        w -= F(self.lr * self.wd) * w
        w -= step_size * m / denom
        u = r if self.sqrt else v
        self.f32[name] = [m, v]
        lo, hi = self.clamp
        ulo, uhi = (lo, hi) if self.sqrt else (lo * lo, hi * hi)
        am = np.abs(self._blocks(m, n)).max(1)
        au = self._blocks(u, n).max(1)
        am = np.where(am > 0, np.clip(am, lo, hi), 0).astype(F)
        au = np.where(au > 0, np.clip(au, ulo, uhi), 0).astype(F)
        ms[:] = self.m_store(am)
        vs[:] = self.v_store(au)
        inv_m = np.where(ms > 0, 1 / np.where(ms > 0, ms, 1), 0).astype(F)
        inv_v = np.where(vs > 0, 1 / np.where(vs > 0, vs, 1), 0).astype(F)
        xm = (self._blocks(m, n) * inv_m[:, None]).reshape(-1)
        if self.m_elements == "stochastic":
            mc[:] = _stochastic(self.mt, xm, self.rng)
        else:
            mc[:] = _nearest(self.mt, xm)
        vc[:] = _nearest(self.vt, (self._blocks(u, n) * inv_v[:, None]).reshape(-1))
        param.reshape(-1)[:] = w

    def decoded_v(self, name, n):
        mc, vc, ms, vs = self.state[name]
        u = (self.vt[vc] * np.repeat(vs, self.bs))[:n]
        return u * u if self.sqrt else u
