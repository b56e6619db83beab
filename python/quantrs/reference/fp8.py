"""FP8 and linear-layer references in pure NumPy (float64 where it matters).

Independent of the Rust code: the FP8 grid is enumerated from the format's
definition (OCP OFP8 v1.0) and casts pick the nearest grid value, ties to the
even code, by searching the sorted grid.
"""

from __future__ import annotations

import numpy as np

_FMT = {"e4m3": (3, 7, 0x7E), "e5m2": (2, 15, 0x7B)}  # mantissa bits, bias, max code


def fp8_grid(fmt: str = "e4m3") -> np.ndarray:
    """Positive finite values of the format in code order (float64)."""
    m, bias, max_code = _FMT[fmt]
    c = np.arange(max_code + 1)
    e, man = c >> m, c & ((1 << m) - 1)
    sub = man * 2.0 ** (1 - bias - m)
    normal = (1 + man / 2.0**m) * 2.0 ** (e - bias)
    return np.where(e == 0, sub, normal)


def fp8_round(x: np.ndarray, fmt: str = "e4m3", saturate: bool = True) -> np.ndarray:
    """Round to the FP8 grid (float64 result); NaN stays NaN. Overflow
    saturates to +-max when ``saturate`` else becomes NaN (E4M3) / inf (E5M2)."""
    x = np.asarray(x, dtype=np.float64)
    g = fp8_grid(fmt)
    a = np.abs(x)
    hi = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lo = hi - 1
    d_lo, d_hi = a - g[lo], g[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    r = np.where(pick_hi, g[hi], g[lo])
    top = g[-1]
    step = g[-1] - g[-2]
    over = (a > top + step / 2) | ((a == top + step / 2) & ((len(g) - 1) % 2 == 1))
    over_val = top if saturate else (np.nan if fmt == "e4m3" else np.inf)
    r = np.where(over, over_val, r)
    r = np.where(np.isnan(a), np.nan, r)
    return np.copysign(r, x)


def fp8_linear_forward(
    x: np.ndarray,
    w_decoded: np.ndarray,
    weight_scale_inv: float,
    activation_scale: float | None = None,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """float64 reference of ``PerTensorFP8Linear.forward``: W8A8 when an
    activation scale is given (x divided in float32, rounded to E4M3 with
    saturation), else weight-only."""
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w_decoded, dtype=np.float64)
    if activation_scale is None:
        xs, mult = x.astype(np.float64), float(weight_scale_inv)
    else:
        xs = fp8_round((x / np.float32(activation_scale)).astype(np.float32), "e4m3", True)
        mult = float(np.float32(activation_scale) * np.float32(weight_scale_inv))
    y = (xs @ w.T) * mult
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)
    return y
