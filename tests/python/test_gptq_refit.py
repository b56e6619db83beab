"""GPTQ's least-squares refit of the group parameters (``refine``, docs/int4.md "GPTQ")
against NumPy's ``lstsq`` on the explicit design matrix, and act-order's exactness
against an independent sweep in the permuted order with static groups."""

from __future__ import annotations

import numpy as np
import pytest
from test_gptq import asym_q, asym_rtn, correlated_inputs, layer, output_error, sym_codes

import quantrs
from quantrs._gptq_refit import fit_rows, refit

pytestmark = pytest.mark.kernel


def design(codes_row: np.ndarray, size: int, asym: bool) -> np.ndarray:
    """``B`` of one row, written out: per group a column of its codes (0 elsewhere) and,
    asymmetric, a column of ones on it."""
    n = len(codes_row)
    cols = []
    for s in range(0, n, size):
        on = np.zeros(n)
        on[s : s + size] = 1
        cols.append(on * codes_row)
        if asym:
            cols.append(on)
    return np.stack(cols, axis=1)


@pytest.mark.parametrize("asym", [True, False])
@pytest.mark.parametrize("n,size", [(96, 32), (80, 32), (64, 64)])
def test_fit_equals_numpy_lstsq(asym, n, size):
    """With ``H = X^T X``, the refit minimizes ``|X (w - B theta)|^2``: NumPy's lstsq of
    ``X B`` against ``X w``, row by row (groups of 32 on 80 inputs: a short last one)."""
    rng = np.random.default_rng(3)
    x = correlated_inputs(400, n, seed=4).astype(np.float64)
    w = rng.standard_normal((5, n))
    lo, hi = (0, 15) if asym else (-8, 7)
    codes = rng.integers(lo, hi + 1, size=(5, n))
    theta = fit_rows(w, x.T @ x, codes, size, asym)
    for r in range(5):
        b = design(codes[r].astype(np.float64), size, asym)
        want = np.linalg.lstsq(x @ b, x @ w[r], rcond=None)[0]
        np.testing.assert_allclose(theta[r].ravel(), want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("fmt", ["int4", "int4_asym"])
def test_refit_never_raises_the_hessian_error(fmt):
    """Per row, the stored (rounded) refit is kept only where it lowers ``e^T H e``; on
    correlated inputs it lowers the layer's output error."""
    x, w = correlated_inputs(1024, 256), layer(32, 256)
    h = 2 * x.astype(np.float64).T @ x

    def per_row(q):
        deq = q.dequantize().T if fmt == "int4" else q.dequantize()
        e = w.astype(np.float64) - deq
        return np.einsum("ij,ij->i", e @ (h + 0.01 * np.mean(np.diag(h)) * np.eye(256)), e)

    plain = quantrs.gptq(w, h, format=fmt, group_size=64, refine=0)
    fitted = quantrs.gptq(w, h, format=fmt, group_size=64, refine=1)
    assert (per_row(fitted) <= per_row(plain)).all()
    again = quantrs.gptq(w, h, format=fmt, group_size=64, refine=3)  # sweeps in between
    assert (per_row(again) <= per_row(fitted)).all()
    a, b = ((q.dequantize().T if fmt == "int4" else q.dequantize()) for q in (fitted, plain))
    assert output_error(x, w, a) < 0.98 * output_error(x, w, b)
    # the codes are the sweep's; only the parameters moved
    if fmt == "int4":
        assert np.array_equal(sym_codes(fitted), sym_codes(plain))
    else:
        assert np.array_equal(np.array(fitted.codes()), np.array(plain.codes()))


def test_refit_keeps_rows_it_cannot_improve():
    """A row already on its grid (zero error) keeps its parameters bit for bit."""
    w = np.zeros((2, 64))
    w[0] = np.tile(np.arange(16), 4) * 0.5 - 1.0  # exactly d = 0.5, m = -1 per group
    w[1] = np.linspace(-1, 1, 64)
    codes = np.zeros((2, 64), np.int64)
    codes[0] = np.tile(np.arange(16), 4)
    params = np.zeros((2, 2, 2), np.float32)
    params[0] = (0.5, -1.0)
    params[1] = (0.125, -1.0)
    codes[1] = np.clip(np.round((w[1] + 1) / 0.125), 0, 15)
    got = refit(w, np.eye(64), codes, params, 32)
    assert np.array_equal(got[0], params[0])
    assert not np.array_equal(got[1], params[1])  # the clipped row moves
    assert got.dtype == np.float32
    assert np.array_equal(got[1].astype(np.float16).astype(np.float32), got[1])


def reference_act_order(w, h, gs, params, quant, damp=0.01):
    """Algorithm 1 over the columns in decreasing ``diag(H)`` (stable), each column
    quantized with its group's parameters fixed beforehand (static groups)."""
    order = np.argsort(-np.diag(h), kind="stable")
    hp = h[np.ix_(order, order)] + damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(np.linalg.inv(hp)).T
    wp = w.astype(np.float64)[:, order].copy()
    codes = np.zeros(w.shape)
    for j, col in enumerate(order):
        g = col // gs
        q, deq = quant(wp[:, j], tuple(p[:, g] for p in params))
        codes[:, col] = q
        err = (wp[:, j] - deq) / u[j, j]
        wp[:, j + 1 :] -= np.outer(err, u[j, j + 1 :])
    return codes


def test_act_order_equals_the_permuted_reference():
    """act_order: the codes of a sweep in decreasing ``diag(H)`` with every group's
    ``(d, m)`` from the original weights ("rtn"), and the file is the format's own."""
    x, w = correlated_inputs(512, 128), layer(12, 128)
    h = 2 * x.astype(np.float64).T @ x
    qa = quantrs.gptq(w, h, format="int4_asym", group_size=32, grid="rtn", act_order=True, refine=0)
    dm = [asym_rtn(w[:, s : s + 32]) for s in range(0, 128, 32)]
    params = (np.stack([d for d, _ in dm], 1), np.stack([m for _, m in dm], 1))
    want = reference_act_order(w, h, 32, params, asym_q)
    assert np.array_equal(np.array(qa.codes()), want)
    stored = np.array(qa.scales())
    assert np.array_equal(stored[:, :, 0], params[0])
    assert np.array_equal(stored[:, :, 1], params[1])


def test_bad_refine_is_refused():
    w, h = layer(4, 64), np.eye(64)
    for bad in (-1, 1.5, True, 101):
        with pytest.raises(quantrs.InvalidArgument, match="refine: expected an integer"):
            quantrs.gptq(w, h, refine=bad)
