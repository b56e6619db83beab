"""bfloat16 activations through INT4: ``_core.int4_linear_bf16`` and ``Int4Linear`` on a
bfloat16 input return bfloat16, within one bf16 rounding of the float64 product of the
same (bf16) input and the dequantized weight, at prefill batches (the bf16 tile GEMM on
AMX) and small ones (the float32 kernels)."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs

torch = pytest.importorskip("torch")


def _weight(k: int, n: int, gs: int, seed: int):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return quantrs.QuantizedWeight.quantize(w, group_size=gs)


def _bound(xf: np.ndarray, wd: np.ndarray, gs: int) -> np.ndarray:
    """One bf16 rounding of the result (2^-8 relative) plus the f32 sums' bound
    (docs/int4.md: ``(gs * parts + groups + 2) * 2^-23`` of the magnitude)."""
    mag = np.abs(xf) @ np.abs(wd)
    return 2.0**-8 * mag + (gs + wd.shape[0] // gs + 4) * 2.0**-23 * mag + 1e-30


@pytest.mark.parametrize("k,n,gs", [(576, 576, 32), (576, 192, 128), (256, 70, 64)])
@pytest.mark.parametrize("m", [3, 16, 33, 130])
def test_core_bf16_matches_float64(k, n, gs, m):
    q = _weight(k, n, gs, k + n + m)
    rng = np.random.default_rng(m)
    xb = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16)
    bias = rng.standard_normal(n).astype(np.float32)
    bits = xb.view(torch.uint16).numpy()
    args = (np.asarray(q.data), np.asarray(q.scales), bias, k, n, q.num_groups)
    y = quantrs._core.int4_linear_bf16(bits, *args)
    assert y.dtype == np.uint16 and y.shape == (m, n)
    got = torch.from_numpy(y).view(torch.bfloat16).double().numpy()
    xf = xb.double().numpy()
    wd = np.asarray(q.dequantize(), np.float64)
    want = xf @ wd + bias
    assert np.all(np.abs(got - want) <= _bound(xf, wd, gs) + 2.0**-8 * np.abs(bias))
    # The same numbers as the float32 path rounded once to bf16, within that path's bound.
    yf = q.matmul(xb.float().numpy()) + bias
    assert np.all(np.abs(got - yf) <= _bound(xf, wd, gs) + 2.0**-8 * np.abs(bias))


def test_core_bf16_rejects_wrong_inputs():
    q = _weight(64, 4, 32, 1)
    args = (np.asarray(q.data), np.asarray(q.scales), None, 64, 4, 2)
    with pytest.raises(TypeError, match="x"):
        quantrs._core.int4_linear_bf16(np.ones((2, 64), np.float32), *args)
    with pytest.raises(quantrs.QuantError, match="x"):
        quantrs._core.int4_linear_bf16(np.ones((2, 63), np.uint16), *args)
    with pytest.raises(quantrs.QuantError, match="bias"):
        quantrs._core.int4_linear_bf16(
            np.ones((2, 64), np.uint16), args[0], args[1], np.ones(3, np.float32), 64, 4, 2
        )


@pytest.mark.parametrize("m", [5, 64])
def test_int4linear_bf16_in_bf16_out(m):
    from quantrs.torch import Int4Linear

    torch.manual_seed(m)
    lin = torch.nn.Linear(576, 192)
    layer = Int4Linear.from_linear(lin, group_size=32)
    x = torch.randn(2, m, 576).to(torch.bfloat16)
    with torch.inference_mode():
        y = layer(x)
        y32 = layer(x.float())
    assert y.dtype == torch.bfloat16 and y.shape == (2, m, 192)
    qw = layer.quantized_weight()
    wd = np.asarray(qw.dequantize(), np.float64)
    xf = x.double().reshape(-1, 576).numpy()
    want = xf @ wd + lin.bias.detach().double().numpy()
    got = y.double().reshape(-1, 192).numpy()
    b = _bound(xf, wd, 32) + 2.0**-8 * np.abs(want)
    assert np.all(np.abs(got - want) <= b)
    assert np.all(np.abs(got - y32.double().reshape(-1, 192).numpy()) <= b)
