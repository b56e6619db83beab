"""QAT reference: float64 AdamW and fake quantization, in pure NumPy.

Independent of the Rust code on purpose (the contract: docs/qat.md):

- AdamW, PyTorch order: ``w -= lr * wd * w`` on the old weight, then
  ``w -= lr * mhat / (sqrt(vhat) + eps)`` with bias-corrected moments.
- Integer calibration: symmetric ``scale = absmax / qmax`` (ranges int8
  [-127, 127], int4 [-7, 7]); affine: ``[min, max]`` widened to include 0,
  ranges [-128, 127] / [-8, 7], ``scale = (max - min) / (qmax - qmin)``,
  ``zero_point = clip(round_half_even(qmin - min / scale), qmin, qmax)``.
  Percentile calibration uses ``np.quantile`` (linear interpolation).
- ``q = clip(round_half_even(x / scale + zp), qmin, qmax)``,
  ``fake = (q - zp) * scale``.
- FP8: nearest-even rounding onto the E4M3 / E5M2 grid computed from the
  binary exponent (``np.frexp``), saturating at +-max, NaN kept.
"""

from __future__ import annotations

import numpy as np

from .._core import InvalidArgument

_RANGES = {
    ("int8", "symmetric"): (-127, 127),
    ("int8", "affine"): (-128, 127),
    ("int4", "symmetric"): (-7, 7),
    ("int4", "affine"): (-8, 7),
}
# (mantissa bits, exponent bias, max finite value)
_FP8 = {"fp8_e4m3": (3, 7, 448.0), "fp8_e5m2": (2, 15, 57344.0)}


def adamw_step(w, g, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """One float64 AdamW step (``t`` 1-based); returns new ``(w, m, v)``."""
    w = np.asarray(w, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    m = beta1 * np.asarray(m, dtype=np.float64) + (1 - beta1) * g
    v = beta2 * np.asarray(v, dtype=np.float64) + (1 - beta2) * (g * g)
    w = w - lr * weight_decay * w
    mhat = m / (1 - beta1**t)
    vhat = v / (1 - beta2**t)
    w = w - lr * mhat / (np.sqrt(vhat) + eps)
    return w, m, v


def qparams_minmax(lo, hi, target="int8", scheme="symmetric"):
    """``(scale, zero_point, qmin, qmax)`` for the range ``[lo, hi]``."""
    qmin, qmax = _RANGES[(target, scheme)]
    lo, hi = float(lo), float(hi)
    if scheme == "symmetric":
        scale = max(abs(lo), abs(hi)) / qmax
        if scale == 0.0:
            raise InvalidArgument(f"lo, hi: degenerate calibration range [{lo}, {hi}]: scale is 0")
        return scale, 0, qmin, qmax
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / (qmax - qmin)
    if scale == 0.0:
        raise InvalidArgument(f"lo, hi: degenerate calibration range [{lo}, {hi}]: empty")
    zp = int(np.clip(np.round(qmin - lo / scale), qmin, qmax))
    return scale, zp, qmin, qmax


def calibrate(x, target="int8", scheme="symmetric", clip_fraction=0.0):
    """Per-tensor ``(scale, zero_point, qmin, qmax)`` (percentile if clipping)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    if clip_fraction == 0.0:
        return qparams_minmax(x.min(), x.max(), target, scheme)
    if scheme == "symmetric":
        a = np.quantile(np.abs(x), 1.0 - clip_fraction)
        return qparams_minmax(-a, a, target, scheme)
    lo, hi = np.quantile(x, [clip_fraction, 1.0 - clip_fraction])
    return qparams_minmax(lo, hi, target, scheme)


def fake_quant_int(x, scale, zero_point, qmin, qmax):
    """Nearest-even integer fake quantization in float64."""
    x = np.asarray(x, dtype=np.float64)
    q = np.clip(np.round(x / scale + zero_point), qmin, qmax)
    return (q - zero_point) * scale


def fp8_round(x, target="fp8_e4m3"):
    """Nearest-even saturating rounding onto an FP8 grid, in float64."""
    mbits, bias, fmax = _FP8[target]
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(invalid="ignore", over="ignore"):
        _, e2 = np.frexp(np.where(np.isfinite(a), a, 1.0))
        e = np.maximum(e2.astype(np.int64) - 1, 1 - bias)
        quantum = np.ldexp(1.0, e - mbits)
        y = np.round(a / quantum) * quantum
        y = np.where(y > fmax, fmax, y)
        y = np.where(np.isinf(a), fmax, y)
    return np.where(np.isnan(x), np.nan, np.copysign(y, x))


def fake_quant(x, target="int8", scheme="symmetric", clip_fraction=0.0, axis=None):
    """Calibrate and fake-quantize (nearest); ``axis`` gives per-channel."""
    x = np.asarray(x, dtype=np.float64)
    if target in _FP8:
        return fp8_round(x, target)
    if axis is None:
        return fake_quant_int(x, *calibrate(x, target, scheme, clip_fraction))
    out = np.empty_like(x)
    for c in range(x.shape[axis]):
        idx = (c, slice(None)) if axis == 0 else (slice(None), c)
        out[idx] = fake_quant_int(x[idx], *calibrate(x[idx], target, scheme, clip_fraction))
    return out


def fake_quant_backward(grad, x, lo, hi):
    """Straight-through estimator: ``grad`` inside ``[lo, hi]``, else 0."""
    grad = np.asarray(grad)
    x = np.asarray(x)
    return np.where((x >= lo) & (x <= hi), grad, np.zeros_like(grad))


def qat_step(w, g, m, v, t, target="int8", scheme="symmetric", **hyper):
    """AdamW, then the nearest-rounded fake-quantized view: ``(w, m, v, wq)``."""
    w, m, v = adamw_step(w, g, m, v, t, **hyper)
    return w, m, v, fake_quant(w, target, scheme)
