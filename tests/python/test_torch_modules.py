"""quantrs.torch.Int4Linear / FP8Linear / quantize_ against the float model and NumPy
references of the formats."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

import quantrs
import quantrs.torch as qt

# Small tensors: one intra-op thread (OpenMP threads spin-waiting on a busy 2-core CI
# machine make torch ~30x slower here, and nothing below needs them).
torch.set_num_threads(1)


def linear(in_f, out_f, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(in_f, out_f, bias=bias)


def int4_reference(w: np.ndarray, group_size: int) -> np.ndarray:
    """Symmetric INT4 per group of ``group_size`` inputs: an independent NumPy bound
    check (each weight within half a step of its group's grid, step = absmax / 7)."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, -1, group_size)
    return np.repeat(np.abs(g).max(axis=2) / 7, group_size, axis=1).reshape(out_f, in_f)


@pytest.mark.parametrize("group_size", [32, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_int4_linear_against_the_float_layer(group_size, bias):
    lin = linear(128, 48, bias)
    q = qt.Int4Linear.from_linear(lin, group_size=group_size, method="rtn")  # the reference's
    w = lin.weight.detach().numpy()
    wq = q.dequantize().numpy()
    step = int4_reference(w, group_size)
    assert np.all(np.abs(wq - w) <= step / 2 * (1 + 1e-5) + 1e-7)
    x = torch.randn(5, 128)
    y = q(x)
    ref = x.numpy().astype(np.float64) @ wq.T.astype(np.float64)
    if bias:
        ref += lin.bias.detach().numpy()
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
    # Against the float model, within the format's bound: sum |x| * half a step.
    err_bound = np.abs(x.numpy()) @ (step / 2).T + 1e-4
    assert np.all(np.abs(y.numpy() - lin(x).detach().numpy()) <= err_bound)
    assert y.dtype == torch.float32 and not y.requires_grad


@pytest.mark.parametrize("shape", [(64,), (1, 64), (2, 3, 64), (33, 64)])
def test_any_leading_batch_shape(shape):
    lin = linear(64, 10)
    for q in (qt.Int4Linear.from_linear(lin), qt.FP8Linear.from_linear(lin)):
        x = torch.randn(*shape)
        y = q(x)
        assert y.shape == (*shape[:-1], 10)
        flat = q(x.reshape(-1, 64)).reshape(*shape[:-1], 10)
        torch.testing.assert_close(y, flat, rtol=1e-6, atol=1e-6)


def test_fp8_linear_against_the_rust_layer_and_e4m3():
    lin = linear(96, 24)
    w = lin.weight.detach().numpy()
    q = qt.FP8Linear.from_linear(lin)
    scale = np.float32(np.abs(w).max()) / np.float32(448)
    assert float(q.weight_scale_inv) == scale
    codes = (w / scale).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(q.weight.numpy(), codes.view(np.uint8))
    x = torch.randn(7, 96)
    wd = codes.astype(np.float64) * scale
    ref = x.numpy().astype(np.float64) @ wd.T + lin.bias.detach().numpy()
    np.testing.assert_allclose(q(x).numpy(), ref, rtol=1e-4, atol=1e-4)
    # E4M3 keeps 3 mantissa bits: each weight within 2^-4 of itself (normal range).
    big = np.abs(w) > scale * 2**-6
    assert np.all(np.abs(wd - w)[big] <= np.abs(w)[big] * 2**-4 * (1 + 1e-6))
    rust = quantrs.PerTensorFP8Linear.from_float(w, lin.bias.detach().numpy())
    assert np.array_equal(q(x).numpy(), rust.forward(x.numpy()))


def test_fp8_w8a8_uses_the_activation_scale():
    lin = linear(64, 8)
    a = qt.FP8Linear.from_linear(lin, activation_scale=0.01)
    b = qt.FP8Linear.from_linear(lin)
    x = torch.randn(4, 64)
    assert not torch.allclose(a(x), b(x), rtol=1e-2)
    assert float(a.activation_scale) == pytest.approx(0.01)


@pytest.mark.parametrize("make", [qt.Int4Linear.from_linear, qt.FP8Linear.from_linear])
def test_state_dict_and_torch_save_round_trip(make):
    lin = linear(64, 16)
    q = make(lin)
    x = torch.randn(3, 64)
    y = q(x)
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    fresh = make(linear(64, 16, seed=5))
    assert not torch.equal(fresh(x), y)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh(x), y)  # the Rust layer was rebuilt from the new buffers
    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=False)(x), y)
    keys = set(q.state_dict())
    assert "bias" in keys and all(not isinstance(t, nn.Parameter) for t in q.state_dict().values())


def test_int4_constructor_shapes_match_from_linear():
    lin = linear(64, 16)
    q = qt.Int4Linear.from_linear(lin, group_size=32)
    empty = qt.Int4Linear(64, 16, group_size=32)
    assert {k: (v.shape, v.dtype) for k, v in empty.state_dict().items()} == {
        k: (v.shape, v.dtype) for k, v in q.state_dict().items()
    }
    assert q.qweight.dtype == torch.uint8 and q.qweight.numel() == 64 * 16 // 2


class _Toy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 64)
        self.blocks = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)
        self.lm_head = nn.Linear(64, 50, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + self.blocks(h)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.lm_head(h)


@pytest.mark.parametrize("method", ["int4", "fp8"])
def test_quantize_replaces_linears_in_place(method):
    model = _Toy().eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        ref = model(ids)
    out = qt.quantize_(model, method)
    assert out is model
    kind = qt.Int4Linear if method == "int4" else qt.FP8Linear
    assert isinstance(model.blocks[0], kind) and isinstance(model.blocks[2], kind)
    assert type(model.lm_head) is nn.Linear  # left alone by default
    assert type(model.attn.out_proj) is not kind  # read directly by attention
    with torch.no_grad():
        y = model(ids)
    rel = float((y - ref).norm() / ref.norm())
    assert 0 < rel < (0.1 if method == "int4" else 0.05)


def test_quantize_filter_and_shared_modules():
    shared = linear(32, 32)
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Linear(32, 4))
    seen = []

    def pick(m, fqn):
        seen.append(fqn)
        return fqn != "3"

    qt.quantize_(model, "int4", filter_fn=pick)
    assert isinstance(model[0], qt.Int4Linear) and model[0] is model[2]
    assert type(model[3]) is nn.Linear
    assert "3" in seen
    head = nn.Sequential()
    head.add_module("lm_head", linear(32, 8))
    qt.quantize_(head, "fp8", filter_fn=lambda m, n: True)
    assert isinstance(head.lm_head, qt.FP8Linear)


def test_bad_inputs():
    q = qt.Int4Linear.from_linear(linear(64, 8))
    with pytest.raises(ValueError, match="in_features=64"):
        q(torch.randn(3, 63))
    with pytest.raises(TypeError, match="floating-point"):
        q(torch.ones(3, 64, dtype=torch.int64))
    with pytest.raises(ValueError, match="device"):
        q(torch.ones(3, 64, device="meta"))
    with pytest.raises(ValueError, match="method"):
        qt.quantize_(nn.Sequential(linear(64, 8)), "int3")
    with pytest.raises(TypeError, match="nn.Linear"):
        qt.Int4Linear.from_linear(nn.Conv1d(3, 3, 1))
    with pytest.raises(quantrs.QuantError):
        qt.Int4Linear.from_linear(linear(64, 8), group_size=0)


def test_input_grad_and_other_float_inputs():
    lin = linear(64, 8)
    q = qt.Int4Linear.from_linear(lin)
    x = torch.randn(2, 64, requires_grad=True)
    y = q(x)
    assert y.requires_grad  # the input's gradient: tests/python/test_torch_grad.py
    torch.testing.assert_close(q(x.detach().to(torch.bfloat16)), q(x.detach().to(torch.bfloat16)))
