"""Input gradients through ``GgufLinear`` (GGUF block weights and ``int4_asym``): the
gradient equals torch's float64 ``F.linear`` on the dequantized weight within f32
summation, the weight decoded a band of rows at a time (``dequantize_rows``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gguf_blocks import random_blocks

import quantrs
import quantrs.torch as qt
from quantrs.torch import _gguf_op

torch.manual_seed(0)


def _packed(kind: str, out_f: int, in_f: int):
    if kind == "int4_asym":
        w = np.random.default_rng(3).standard_normal((out_f, in_f)).astype(np.float32)
        return quantrs.Int4AsymWeight.quantize(w, group_size=32)
    # Small scales so that the decoded weights stay O(1).
    blocks = random_blocks(kind.upper(), out_f, in_f, seed=5)
    return quantrs.GgufWeight.from_bytes(kind, (out_f, in_f), blocks)


KINDS = [("q4_0", 64), ("q8_0", 64), ("q4_k", 256), ("q6_k", 256), ("int4_asym", 96)]


def _bound(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """f32 summation over `out` terms: out * 2^-23 * sum |g w| (docs/torch.md)."""
    return g.shape[-1] * 2.0**-23 * (g.abs().double() @ w.abs().double()) + 1e-30


@pytest.mark.parametrize("kind,in_f", KINDS)
@pytest.mark.parametrize("lead", [(3,), (2, 5)])
def test_input_grad_matches_float64_linear(kind, in_f, lead, monkeypatch):
    # Bands of 7 rows: several bands and a short last one.
    monkeypatch.setattr(_gguf_op, "_TILE_FLOATS", 7 * in_f)
    packed = _packed(kind, 40, in_f)
    w = torch.from_numpy(packed.dequantize()).double()
    finite = torch.isfinite(w).all(dim=1)
    w = torch.where(finite[:, None], w, torch.zeros_like(w))
    layer = qt.GgufLinear(packed, bias=torch.randn(40))
    x = torch.randn(*lead, in_f, requires_grad=True)
    g = torch.randn(*lead, 40) * finite.float()  # rows with a non-finite weight get no grad
    layer(x).backward(g)
    x64 = x.detach().double().requires_grad_(True)
    torch.nn.functional.linear(x64, w).backward(g.double())
    err = (x.grad.double() - x64.grad).abs()
    assert torch.all(err <= _bound(g, w)), float(err.max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_gets_its_dtype_back(dtype):
    packed = _packed("int4_asym", 24, 64)
    layer = qt.GgufLinear(packed)
    x = torch.randn(4, 64, dtype=dtype, requires_grad=True)
    y = layer(x)
    assert y.dtype == dtype
    y.float().sum().backward()
    assert x.grad.dtype == dtype
    ref = torch.from_numpy(packed.dequantize()).sum(0)
    torch.testing.assert_close(x.grad.float(), ref.expand(4, 64), rtol=1e-2, atol=1e-2)


def test_weight_is_frozen_and_inference_builds_no_graph():
    layer = qt.GgufLinear(_packed("q8_0", 8, 64), bias=torch.randn(8))
    assert not list(layer.parameters()) and not layer.bias.requires_grad
    y = layer(torch.randn(2, 64))
    assert y.grad_fn is None


@pytest.mark.parametrize("kind,in_f", KINDS)
def test_dequantize_rows_are_the_rows_of_dequantize(kind, in_f):
    packed = _packed(kind, 13, in_f)
    full = packed.dequantize()
    for a, b in [(0, 13), (0, 1), (4, 9), (12, 13), (5, 5)]:
        np.testing.assert_array_equal(packed.dequantize_rows(a, b), full[a:b])


@pytest.mark.parametrize("kind,in_f", KINDS[:1] + KINDS[-1:])
def test_dequantize_rows_rejects_bad_ranges(kind, in_f):
    packed = _packed(kind, 13, in_f)
    for a, b in [(5, 4), (0, 14), (14, 14)]:
        with pytest.raises(quantrs.InvalidArgument, match="out_features=13"):
            packed.dequantize_rows(a, b)
    with pytest.raises(quantrs.InvalidArgument, match="start: expected an int in"):
        packed.dequantize_rows(-1, 3)
    with pytest.raises(TypeError, match="stop"):
        packed.dequantize_rows(0, "3")


def test_bad_inputs_name_the_layer():
    layer = qt.GgufLinear(_packed("q8_0", 8, 64))
    with pytest.raises(quantrs.InvalidArgument, match="in_features=64"):
        layer(torch.zeros(2, 63))
    with pytest.raises(quantrs.InvalidArgument, match="in_features=64"):
        layer(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        layer(torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([0.0] * 64)
