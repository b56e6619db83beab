"""Refitting the group parameters of a GPTQ result with its codes fixed (docs/int4.md
"GPTQ", ``refine``).

GPTQ chooses each group's scale (and minimum) when the group starts, then the codes
under them. With the codes ``q`` of one output row fixed, its dequantized values are
linear in the row's parameters: ``w_hat = B theta``, where column ``(g, d)`` of ``B`` is
``q`` on group ``g``'s inputs (0 elsewhere) and, for the asymmetric grid, column
``(g, m)`` is 1 on them. The parameters that minimize GPTQ's own objective, the output
error ``(w - B theta)^T H (w - B theta)`` with the whole Hessian (not only its
diagonal), solve the normal equations ``(B^T H B) theta = B^T H w``: one small system
per row (2 unknowns per group). This is the least-squares step that closes the
"quantize codes, then refit scale and offset" alternation of llama.cpp's
``make_qkx2_quants`` (there per group with the importance weights, ``ggml-quants.c``)
and of the scale refit of OmniQuant / GPTQ follow-ups, applied here across a row's
groups at once, because ``H`` couples them.

The solution is rounded to what the format stores (half for ``int4_asym``, float32 for
``int4``) and kept per row only where that rounded fit lowers the objective, so a refit
never makes a row worse under ``H``.
"""

from __future__ import annotations

import numpy as np

# Relative ridge on the normal equations: a group whose codes are all equal makes its
# step and minimum collinear; the ridge picks a finite solution, the objective check
# decides whether it is kept.
RIDGE = 1e-10
HALF_MAX = 65504.0


def fit_rows(w: np.ndarray, h: np.ndarray, codes: np.ndarray, size: int, asym: bool) -> np.ndarray:
    """The least-squares parameters ``[out, groups, 1 or 2]`` (float64) of every row of
    ``w`` (float64 ``[out, in]``) for fixed ``codes`` (``[out, in]``) in groups of
    ``size`` consecutive inputs (the last may be shorter), under ``h`` (``[in, in]``,
    positive definite): ``(d, m)`` per group with ``asym``, ``scale`` without."""
    out_feat, in_feat = w.shape
    starts = np.arange(0, in_feat, size)
    k = 2 if asym else 1
    n = len(starts) * k
    q = codes.astype(np.float64)
    wh = w @ h

    def per_group(m: np.ndarray) -> np.ndarray:  # sums over each group's inputs
        return np.add.reduceat(m, starts, axis=1)

    gram = np.empty((out_feat, n, n))
    rhs = np.empty((out_feat, n))
    rhs[:, 0::k] = per_group(q * wh)
    for g, s in enumerate(starts):
        rows = slice(s, s + size)
        t = q[:, rows] @ h[rows]  # H times group g's code column, per output row
        gram[:, k * g, 0::k] = per_group(t * q)
        if asym:
            ones = h[rows].sum(0)  # H times group g's ones column
            gram[:, k * g, 1::k] = per_group(t)
            gram[:, k * g + 1, 0::k] = per_group(q * ones)
            gram[:, k * g + 1, 1::k] = per_group(ones[None, :])
    if asym:
        rhs[:, 1::k] = per_group(wh)
    scale = np.trace(gram, axis1=1, axis2=2) / n
    gram[:, np.arange(n), np.arange(n)] += RIDGE * np.maximum(scale, 1e-300)[:, None]
    theta = np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]
    return theta.reshape(out_feat, len(starts), k)


def expand(params: np.ndarray, codes: np.ndarray, size: int, asym: bool) -> np.ndarray:
    """The dequantized rows ``[out, in]`` in float32 as the formats compute them:
    ``q * scale``, or ``d * q + m`` (a rounded product, then a rounded add)."""
    in_feat = codes.shape[1]
    p = np.repeat(params.astype(np.float32), size, axis=1)[:, :in_feat]
    q = codes.astype(np.float32)
    if asym:
        return p[:, :, 0] * q + p[:, :, 1]
    return q * p[:, :, 0]


def objective(w: np.ndarray, h: np.ndarray, deq: np.ndarray) -> np.ndarray:
    """Per row, ``(w - deq)^T H (w - deq)``."""
    e = w - deq.astype(np.float64)
    return np.einsum("ij,ij->i", e @ h, e)


def refit(
    w: np.ndarray, h: np.ndarray, codes: np.ndarray, params: np.ndarray, size: int
) -> np.ndarray:
    """``params`` (float32 ``[out, groups, 1 or 2]``, the format's stored values) with
    each row replaced by its rounded least-squares fit for ``codes`` where that lowers
    the objective under ``h``; rows whose fit is not finite or not representable keep
    theirs."""
    asym = params.shape[2] == 2
    fit = fit_rows(w, h, codes, size, asym)
    with np.errstate(over="ignore", invalid="ignore"):
        new = fit.astype(np.float16 if asym else np.float32).astype(np.float32)
    ok = np.isfinite(new).all(axis=(1, 2))
    if asym:
        ok &= (np.abs(new) <= HALF_MAX).all(axis=(1, 2))
    else:
        ok &= (np.abs(new) >= 1e-8).all(axis=(1, 2))  # the format's smallest scale
    new[~ok] = params[~ok]
    better = objective(w, h, expand(new, codes, size, asym)) < objective(
        w, h, expand(params, codes, size, asym)
    )
    return np.where(better[:, None, None], new, params).astype(np.float32)


def better_rows(
    w: np.ndarray,
    h: np.ndarray,
    size: int,
    a: tuple[np.ndarray, np.ndarray],
    b: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ``(codes, params)`` of ``a`` or ``b`` with the lower objective under
    ``h`` (``a`` on ties)."""
    asym = a[1].shape[2] == 2
    err_a = objective(w, h, expand(a[1], a[0], size, asym))
    take = objective(w, h, expand(b[1], b[0], size, asym)) < err_a
    codes = np.where(take[:, None], b[0], a[0])
    return codes, np.where(take[:, None, None], b[1], a[1]).astype(np.float32)
