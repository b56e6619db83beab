"""GPTQ into ``int4_k`` (``quantrs.gptq(..., format="int4_k")``, docs/int4.md "GPTQ"):
static groups from the importance-weighted search, codes by the sweep; checked against
the published algorithm in NumPy (test_gptq's reference) and the format's formula."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_gptq import correlated_inputs, layer, output_error, reference_gptq

import quantrs

pytestmark = pytest.mark.kernel


def k_values(scale_codes: np.ndarray, supers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """docs/int4.md "k-quant-style INT4": per group of 32 and output, the step ``D sc``
    and the minimum ``Dmin mn``, in float32 (``[out, groups]`` each)."""
    per_super = scale_codes.shape[1] // supers.shape[1]
    sup = np.repeat(supers.astype(np.float32), per_super, axis=1)
    sc = scale_codes.astype(np.float32)
    return sup[:, :, 0] * sc[:, :, 0], sup[:, :, 1] * sc[:, :, 1]


def test_codes_equal_the_reference_sweep_over_the_search_groups():
    x, w = correlated_inputs(512, 256), layer(16, 256)
    h = 2 * x.astype(np.float64).T @ x
    qk = quantrs.gptq(w, h, format="int4_k")
    imp = np.diag(h).astype(np.float32)
    search = quantrs.Int4KWeight.quantize(w, method="search", importance=imp)
    # Static groups: exactly the search's parameters on the original weights.
    assert np.array_equal(qk.scale_codes(), search.scale_codes())
    assert np.array_equal(qk.supers(), search.supers())
    d, m = k_values(np.array(search.scale_codes()), np.array(search.supers()))
    group = iter(range(d.shape[1]))

    def choose(_cols):
        g = next(group)
        return d[:, g].astype(np.float64), m[:, g].astype(np.float64)

    def quant(col, dm):
        dg, mg = dm
        t = np.divide(col + mg, dg, out=np.zeros_like(col), where=dg != 0)
        q = np.clip(np.rint(t), 0, 15)
        return q, dg * q - mg

    want = reference_gptq(w, h, 32, choose, quant)
    codes = np.array(qk.codes())
    assert (codes == want).mean() > 0.999  # lazy batches: float64 sums in another order
    # A valid int4_k weight whose values are the format's formula.
    assert codes.dtype == np.uint8 and codes.max() <= 15
    vals = np.repeat(d, 32, axis=1) * codes - np.repeat(m, 32, axis=1)
    np.testing.assert_array_equal(qk.dequantize(), vals.astype(np.float32))


@pytest.mark.parametrize("act_order", [False, True])
def test_output_error_below_the_search(act_order):
    x, w = correlated_inputs(1024, 256), layer(32, 256)
    h = 2 * x.astype(np.float64).T @ x
    imp = (x.astype(np.float64) ** 2).mean(0).astype(np.float32)
    qk = quantrs.gptq(w, h, format="int4_k", act_order=act_order)
    search = quantrs.Int4KWeight.quantize(w, method="search", importance=imp)
    assert output_error(x, w, qk.dequantize()) < 0.8 * output_error(x, w, search.dequantize())


def test_row_super_block_and_bad_inputs():
    # 96 inputs: one super-block per row (256 does not divide them).
    x, w = correlated_inputs(256, 96), layer(8, 96)
    h = 2 * x.astype(np.float64).T @ x
    qk = quantrs.gptq(w, h, format="int4_k", grid="rtn")
    assert qk.super_block == 96 and np.array(qk.supers()).shape == (8, 1, 2)
    with pytest.raises(quantrs.QuantError, match="32"):
        quantrs.gptq(layer(8, 80), np.eye(80), format="int4_k")
    with pytest.raises(quantrs.InvalidArgument, match="method"):
        quantrs.gptq(w, h, format="int4_k", grid="full")
    with pytest.raises(quantrs.InvalidArgument, match="int4_k"):
        quantrs.gptq(w, h, format="int5")
    with pytest.raises(quantrs.InvalidArgument, match=r"group_size: .*got 128"):
        quantrs.gptq(w, h, format="int4_k", group_size=128)


def test_quantize_gptq_into_int4_k():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    batches = [torch.from_numpy(correlated_inputs(64, 128, seed=s)) for s in range(4)]
    with torch.no_grad():
        ref = [model(b) for b in batches]
    plain = qt.quantize_(copy.deepcopy(model), "int4_k", calibration=batches, quantizer="search")
    gq = qt.quantize_(model, "int4_k", calibration=batches, quantizer="gptq")
    assert isinstance(gq[0], qt.GgufLinear) and gq[0].weight_packed.type == "int4_k"
    with torch.no_grad():
        err_g = sum(float((gq(b) - r).norm()) for b, r in zip(batches, ref))
        err_s = sum(float((plain(b) - r).norm()) for b, r in zip(batches, ref))
    assert err_g < err_s
