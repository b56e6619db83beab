"""Serving through PyTorch: the quantized layers read their own buffers in place (weights
held once, ``load_state_dict`` and buffer replacement seen), the int8-activation INT4 path
from ``Int4Linear`` / ``quantize_``, the optional ``lm_head``, and a transformers Llama
quantized by ``quantize_`` generating what its fake-quantized float twin generates."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from _tiny_llama import tiny_llama
from torch import nn

import quantrs
import quantrs._core as core
import quantrs.torch as qt

torch.manual_seed(0)

# The buffers each layer's kernel reads, by class.
_READ = {
    qt.Int4Linear: ("qweight", "scales"),
    qt.Int8Linear: ("weight", "scales"),
    qt.FP8Linear: ("weight", "weight_scale_inv"),
}


def _pair(cls, in_f: int = 96, out_f: int = 40):
    """Two layers of ``cls`` from different float weights (same shapes)."""
    if cls is qt.Int4Linear:
        return [cls.from_linear(nn.Linear(in_f, out_f), group_size=32) for _ in range(2)]
    return [cls.from_linear(nn.Linear(in_f, out_f)) for _ in range(2)]


def _reference(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torch's own float64 linear on the layer's dequantized weight."""
    b = None if m.bias is None else m.bias.double()
    return nn.functional.linear(x.double(), m.dequantize().double(), b)


@pytest.mark.parametrize("cls", list(_READ))
def test_kernel_reads_the_module_buffers(cls):
    m, _ = _pair(cls)
    x = torch.randn(3, 96)
    with torch.no_grad():
        y = m(x)
    torch.testing.assert_close(y.double(), _reference(m, x), rtol=1e-5, atol=1e-5)
    views = m._views[2]
    for name, view in zip(_READ[cls], views):
        assert view.ctypes.data == getattr(m, name).data_ptr(), name


@pytest.mark.parametrize("cls", list(_READ))
def test_load_state_dict_is_seen_and_keeps_the_storage(cls):
    m, other = _pair(cls)
    x = torch.randn(2, 96)
    with torch.no_grad():
        m(x)  # the views exist before the load
        ptrs = [getattr(m, n).data_ptr() for n in _READ[cls]]
        m.load_state_dict(other.state_dict())
        assert [getattr(m, n).data_ptr() for n in _READ[cls]] == ptrs
        assert torch.equal(m(x), other(x))


@pytest.mark.parametrize("cls", list(_READ))
def test_replaced_buffers_are_read(cls):
    m, other = _pair(cls)
    x = torch.randn(2, 96)
    with torch.no_grad():
        m(x)
        for name in (*_READ[cls], "bias"):
            setattr(m, name, getattr(other, name).clone())
        assert torch.equal(m(x), other(x))
        m.load_state_dict(other.state_dict(), assign=True)
        assert torch.equal(m(x), other(x))


def test_in_place_write_to_the_bias_and_scale_is_seen():
    m, _ = _pair(qt.FP8Linear)
    x = torch.randn(2, 96)
    with torch.no_grad():
        y0 = m(x)
        m.weight_scale_inv.mul_(2)
        m.bias.add_(1)
        torch.testing.assert_close(m(x), 2 * (y0 - (m.bias - 1)) + m.bias)


@pytest.mark.parametrize("cls", list(_READ))
def test_pickled_module_carries_no_views(cls):
    m, _ = _pair(cls)
    x = torch.randn(2, 96)
    with torch.no_grad():
        y = m(x)
        buf = io.BytesIO()
        torch.save(m, buf)
        size_with = buf.tell()
        fresh = _pair(cls)[0]
        buf2 = io.BytesIO()
        torch.save(fresh, buf2)
        assert size_with == buf2.tell()
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        assert torch.equal(back(x), y)
        assert torch.equal(copy.deepcopy(m)(x), y)


def test_int4_int8_activations_from_the_module_and_quantize_():
    lin = nn.Linear(128, 48)
    m = qt.Int4Linear.from_linear(lin, activations="int8")
    assert "activations='int8'" in repr(m)
    x = torch.randn(3, 128)
    qw = m.quantized_weight()
    want = qw.matmul(x.numpy(), activations="int8") + m.bias.numpy()
    with torch.no_grad():
        np.testing.assert_array_equal(m(x).numpy(), want)
        float_path = qt.Int4Linear.from_linear(lin)(x)
        assert not torch.equal(m(x), float_path)
        # bfloat16 in, bfloat16 out, through the custom op
        assert m(x.bfloat16()).dtype == torch.bfloat16
    model = qt.quantize_(nn.Sequential(nn.Linear(128, 48)), "int4", activations="int8")
    assert model[0].activations == "int8"


def test_bad_activations_and_inputs_raise_naming_the_argument():
    with pytest.raises(quantrs.InvalidArgument, match="activations"):
        qt.Int4Linear(64, 8, activations="bf16")
    with pytest.raises(quantrs.InvalidArgument, match="activations"):
        qt.quantize_(nn.Sequential(nn.Linear(64, 8)), "fp8", activations="int8")
    m = qt.Int4Linear.from_linear(nn.Linear(64, 8))
    with pytest.raises(quantrs.InvalidArgument, match="Int4Linear"):
        m(torch.randn(2, 63))
    q, s = m.qweight.numpy(), m.scales.numpy()
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(TypeError, match="data"):
        core.int4_linear(x, q.astype(np.int8), s, None, 64, 8, 2)
    with pytest.raises(quantrs.QuantError, match="data"):
        core.int4_linear(x, q[:-1], s, None, 64, 8, 2)
    with pytest.raises(quantrs.QuantError, match="bias"):
        core.int4_linear(x, q, s, np.zeros(7, np.float32), 64, 8, 2)
    with pytest.raises(quantrs.QuantError, match="x"):
        core.int4_linear(x[:, :32], q, s, None, 64, 8, 2)
    w = np.zeros((8, 64), np.int8)
    with pytest.raises(quantrs.QuantError, match="scales"):
        core.int8_linear(x, w, np.ones(7, np.float32), None)
    with pytest.raises(quantrs.InvalidArgument, match="weight_scale_inv"):
        core.fp8_linear(x, w.view(np.uint8), np.float32(0.0).reshape(1), None, None)


def _fake_quantized(model: nn.Module) -> nn.Module:
    """``model`` with every quantized layer replaced by an ``nn.Linear`` holding its exact
    dequantization (the reference the quantized model must reproduce)."""
    twin = copy.deepcopy(model)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, (qt.Int4Linear, qt.Int8Linear, qt.FP8Linear)):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None)
            with torch.no_grad():
                lin.weight.copy_(mod.dequantize())
                if mod.bias is not None:
                    lin.bias.copy_(mod.bias)
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, lin)
    return twin


def _generate(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)


def test_llama_quantize_leaves_embeddings_and_head_and_generates_like_its_twin():
    model = tiny_llama(seed=1)
    embed = model.model.embed_tokens.weight.detach().clone()
    qt.quantize_(model, "int4")
    assert type(model.lm_head) is nn.Linear and type(model.model.embed_tokens) is nn.Embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.model.embed_tokens.weight, embed)
    kinds = {type(m) for m in model.modules()}
    assert qt.Int4Linear in kinds and nn.Linear in kinds
    ids = torch.randint(0, 96, (1, 6))
    twin = _fake_quantized(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, twin(ids).logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(_generate(model, ids), _generate(twin, ids))


def test_llama_head_opt_in_keeps_the_tied_embedding():
    model = tiny_llama(seed=1, tie=True)
    embed = model.model.embed_tokens.weight.detach().clone()
    qt.quantize_(model, "int4", include_head=True)
    assert isinstance(model.lm_head, qt.Int4Linear)
    assert type(model.model.embed_tokens) is nn.Embedding
    assert torch.equal(model.model.embed_tokens.weight, embed)
    ids = torch.randint(0, 96, (1, 6))
    twin = _fake_quantized(model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, twin(ids).logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(_generate(model, ids), _generate(twin, ids))
    assert "lm_head.qweight" in model.state_dict()
