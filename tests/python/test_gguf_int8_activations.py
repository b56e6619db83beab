"""``GgufWeight.matmul(x, activations="int8")``: ``x`` quantized per weight block to int8
(ggml's Q8_0 / Q8_K idea: ``d = absmax / 127``, ``q = rint(x / d)``), integer block
dots. Checked against NumPy: the dequantized weight (the ``gguf`` package's
dequantizer, bit for bit ``GgufWeight.dequantize``) times the activations rebuilt from
the NumPy codes, within float32 rounding, and against the float64 product of the
original ``x`` within the activation-rounding bound ``sum_blocks d / 2 * sum |w|``."""

from __future__ import annotations

import numpy as np
import pytest
from test_gguf_blocks import TYPES, random_blocks

import quantrs

EPS32 = float(np.finfo(np.float32).eps)


def quantize_x(x: np.ndarray, elems: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's codes and scales per block of ``elems`` inputs (subnormal scales -> 0)."""
    xb = x.reshape(x.shape[0], -1, elems)
    d = (np.abs(xb).max(axis=2) / np.float32(127)).astype(np.float32)
    d[d < np.finfo(np.float32).tiny] = 0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d[..., None] > 0, np.rint(xb / d[..., None]), 0)
    return np.clip(q, -127, 127), d


@pytest.mark.kernel
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("batch", [1, 3, 16])
def test_int8_activations_against_numpy(name, batch):
    elems = TYPES[name][0]
    out, inf = 7, 1024
    blocks = random_blocks(name, out, inf, seed=11 + batch)
    w = quantrs.GgufWeight.from_bytes(name.lower(), (out, inf), blocks)
    wd = w.dequantize().astype(np.float64)
    if not np.isfinite(wd).all():
        pytest.skip("random scales overflowed")
    rng = np.random.default_rng(batch)
    # Per-block magnitudes from 1e-3 to 1e2, one block all zero.
    mags = 10.0 ** rng.uniform(-3, 2, (batch, inf // elems, 1))
    x = (rng.standard_normal((batch, inf // elems, elems)) * mags).astype(np.float32)
    x[:, 1] = 0
    x = x.reshape(batch, inf)
    y = w.matmul(x, activations="int8")
    assert y.shape == (batch, out) and y.dtype == np.float32
    q, d = quantize_x(x, elems)
    xhat = (q * d[..., None].astype(np.float64)).reshape(batch, inf)
    # Integer block sums are exact; per block a few float32 roundings of its terms,
    # and the float32 weight's own rounding, relative to sum |w| |xhat|.
    mag = np.abs(xhat) @ np.abs(wd).T
    rounding = (inf // elems + 8) * 2 * EPS32 * mag
    np.testing.assert_array_less(np.abs(y - xhat @ wd.T), rounding + 1e-30)
    # Against the unquantized x: each activation within half a step of its code.
    half_step = np.repeat(d.astype(np.float64) / 2, elems, axis=1)
    act_bound = half_step @ np.abs(wd).T
    exact = x.astype(np.float64) @ wd.T
    err = np.abs(y - exact)
    assert np.all(err <= act_bound + rounding + 1e-30)
    # The bound is not vacuous: the int8 path is visibly not the float32 one.
    assert err.max() > 10 * rounding.max()


def test_float32_activations_are_the_default_and_bad_values_are_named():
    blocks = random_blocks("Q4_K", 3, 256, seed=5)
    w = quantrs.GgufWeight.from_bytes("q4_k", (3, 256), blocks)
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    np.testing.assert_array_equal(
        w.matmul(x).view(np.uint32), w.matmul(x, activations="float32").view(np.uint32)
    )
    with pytest.raises(quantrs.InvalidArgument, match="activations"):
        w.matmul(x, activations="int4")
    x[1, 7] = np.nan
    with pytest.raises(quantrs.InvalidArgument, match="non-finite"):
        w.matmul(x, activations="int8")
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        w.matmul(np.zeros((3, 255), np.float32), activations="int8")
