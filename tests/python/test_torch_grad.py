"""Gradients through the quantized linears, their custom ops (torch.compile, torch.export,
inference_mode) and the input's dtype; references are torch's own F.linear in float64 on
the dequantized weight."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _compile_check import assert_compiles_like_eager, assert_model_compiles_like_eager
from torch import nn

import quantrs
import quantrs._core as core
import quantrs.torch as qt

torch.manual_seed(0)


def _layer(kind: str, in_f: int = 96, out_f: int = 40, bias: bool = True) -> nn.Module:
    lin = nn.Linear(in_f, out_f, bias=bias)
    if kind.startswith("int4"):
        return qt.Int4Linear.from_linear(lin, group_size=int(kind[6:]))
    if kind == "int8":
        return qt.Int8Linear.from_linear(lin)
    if kind == "fp8_w8a8":
        return qt.FP8Linear.from_linear(lin, activation_scale=0.02)
    return qt.FP8Linear.from_linear(lin)


KINDS = ["int4_g2", "int4_g32", "int4_g128", "int8", "fp8", "fp8_w8a8"]


def _bound(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """f32 summation over `out` terms: out * 2^-23 * sum |g w| (docs/torch.md)."""
    return g.shape[-1] * 2.0**-23 * (g.abs().double() @ w.abs().double()) + 1e-30


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lead", [(3,), (2, 5), ()])
def test_input_grad_matches_float64_linear(kind, lead):
    q = _layer(kind)
    q.bias.requires_grad_(True)
    w = q.dequantize().double()
    x = torch.randn(*lead, 96, requires_grad=True)
    g = torch.randn(*lead, 40)
    q(x).backward(g)
    x64 = x.detach().double().requires_grad_(True)
    b64 = q.bias.detach().double().requires_grad_(True)
    torch.nn.functional.linear(x64, w, b64).backward(g.double())
    err = (x.grad.double() - x64.grad).abs()
    assert torch.all(err <= _bound(g, w)), float(err.max())
    torch.testing.assert_close(q.bias.grad.double(), b64.grad, rtol=1e-6, atol=1e-5)


def test_grad_against_numpy_transposed_kernel_directly():
    w = np.random.default_rng(1).standard_normal((70, 33)).astype(np.float32)
    qw = quantrs.QuantizedWeight.quantize(w, group_size=32, method="rtn")
    g = np.random.default_rng(2).standard_normal((4, 33)).astype(np.float32)
    ref = g.astype(np.float64) @ qw.dequantize().astype(np.float64).T
    np.testing.assert_allclose(qw.matmul_transposed(g), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(quantrs.QuantError, match="grad_output"):
        qw.matmul_transposed(np.zeros((4, 32), np.float32))


@pytest.mark.parametrize("cls", ["Int8Linear", "UnquantLinear", "Int4Linear", "PerTensorFP8Linear"])
def test_layer_classes_grad_input(cls):
    w = np.random.default_rng(3).standard_normal((24, 50)).astype(np.float32)
    make = core.UnquantLinear if cls == "UnquantLinear" else getattr(core, cls).from_float
    layer = make(w)
    g = np.random.default_rng(4).standard_normal((2, 3, 24)).astype(np.float32)
    wd = np.asarray(layer.dequantize_w(), np.float64)
    np.testing.assert_allclose(layer.grad_input(g), g @ wd, rtol=1e-5, atol=1e-5)
    with pytest.raises(quantrs.QuantError, match="grad_output"):
        layer.grad_input(np.zeros((2, 23), np.float32))


@pytest.mark.parametrize("kind", ["int4_g32", "int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_input_dtype_in_and_out(kind, dtype):
    q = _layer(kind)
    x = torch.randn(4, 96).to(dtype)
    y = q(x)
    assert y.dtype == dtype
    ref = q(x.float())  # the float32 path on the same (rounded) input
    assert torch.equal(y, ref.to(dtype))  # one rounding of the float32 result
    xg = x.clone().requires_grad_(True)
    q(xg).float().sum().backward()
    assert xg.grad.dtype == dtype


def test_frozen_weight_refuses_a_grad():
    q = _layer("int4_g32")
    q.scales.requires_grad_(True)
    with pytest.raises(quantrs.UnsupportedOperation, match="frozen"):
        q(torch.randn(2, 96, requires_grad=True))


def test_inference_mode_and_no_grad():
    q = _layer("int4_g32")
    x = torch.randn(2, 96)
    ref = q(x)
    with torch.inference_mode():
        assert torch.equal(q(x), ref)
    with torch.no_grad():
        assert not q(x.requires_grad_(True)).requires_grad


def test_in_place_write_is_seen():
    q = _layer("int4_g32")
    x = torch.randn(2, 96)
    y0 = q(x)
    with torch.no_grad():
        q.scales.mul_(2)
    torch.testing.assert_close(q(x), 2 * (y0 - q.bias) + q.bias)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(96, 64), nn.Linear(64, 40)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("method", ["int4", "int8", "fp8"])
def test_compile_no_graph_break_bit_for_bit_and_export(method):
    assert_compiles_like_eager(qt.quantize_(_Mlp(), method), torch.randn(3, 96), "quantrs")


def test_llama_block_has_no_graph_break_from_our_layers():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    qt.quantize_(model, "int4")
    ids = torch.randint(0, 64, (1, 8))
    assert_model_compiles_like_eager(model, ids, ("Int4Linear",))
