"""``GgufLinear`` over its ``qweight`` buffer: the custom operator ``quantrs::gguf_linear``
(no graph break, compiled == eager bit for bit, ``torch.export``), the buffer the kernel
reads (``data_ptr``, ``state_dict`` round trip, in-place writes seen), the input's dtype
kept, and ``int4_asym`` g32 stored as Q4_1 blocks with the same values."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from _compile_check import assert_compiles_like_eager, assert_model_compiles_like_eager  # noqa: E402
from _tiny_llama import tiny_llama  # noqa: E402

import quantrs  # noqa: E402
import quantrs.torch as qt  # noqa: E402
from quantrs.torch import GgufLinear  # noqa: E402

_TYPES = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
}


def _weight(kind: str, out: int, inf: int, seed: int = 0) -> quantrs.GgufWeight:
    w = np.random.default_rng(seed).standard_normal((out, inf)).astype(np.float32)
    return quantrs.GgufWeight.from_bytes(kind, (out, inf), gguf.quants.quantize(w, _TYPES[kind]))


def _reference(m: GgufLinear, x: torch.Tensor) -> torch.Tensor:
    """``F.linear`` in float64 on the weight as the ``gguf`` package decodes the buffer."""
    kind = _TYPES[m.weight_type]
    w = gguf.quants.dequantize(m.qweight.numpy(), kind).reshape(m.out_features, m.in_features)
    b = None if m.bias is None else m.bias.double()
    return torch.nn.functional.linear(x.double(), torch.from_numpy(w).double(), b)


@pytest.mark.kernel
@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "q5_0"])
def test_buffer_forward_matches_gguf_reference(kind):
    inf = 256 if kind == "q4_k" else 64
    m = GgufLinear(_weight(kind, 24, inf), torch.randn(24))
    x = torch.randn(3, 5, inf)
    y = m(x)
    assert y.dtype == torch.float32 and y.shape == (3, 5, 24)
    torch.testing.assert_close(y.double(), _reference(m, x), rtol=1e-5, atol=1e-4)


def test_kernel_reads_the_buffer_in_place():
    m = GgufLinear(_weight("q8_0", 16, 64), torch.randn(16))
    x = torch.randn(2, 64)
    y0 = m(x)
    views = m.__dict__["_views"][2]
    assert views[0].ctypes.data == m.qweight.data_ptr()
    assert views[3].ctypes.data == m.bias.data_ptr()
    with torch.no_grad():  # a Q8_0 block: f16 d, then 32 int8 codes; doubling d doubles W
        d = m.qweight[:, :2].clone().view(torch.float16)
        m.qweight[:, :2].copy_((d * 2).view(torch.uint8))
    want = _reference(m, x)
    torch.testing.assert_close(m(x).double(), want, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(m(x), y0)


def test_state_dict_round_trip_holds_the_packed_bytes():
    src = GgufLinear(_weight("q4_1", 16, 64, seed=1), torch.randn(16))
    dst = GgufLinear(_weight("q4_1", 16, 64, seed=2), torch.zeros(16))
    sd = src.state_dict()
    assert sd["qweight"].dtype == torch.uint8 and sd["qweight"].shape == (16, 2 * 20)
    x = torch.randn(4, 64)
    ptr = dst.qweight.data_ptr()
    dst(x)  # views cached before the load: the load writes into the same storage
    dst.load_state_dict(sd)
    assert dst.qweight.data_ptr() == ptr
    assert torch.equal(dst(x), src(x))
    np.testing.assert_array_equal(dst.weight_packed.to_bytes(), src.weight_packed.to_bytes())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_input_dtype_is_kept(dtype):
    m = GgufLinear(_weight("q8_0", 24, 64), torch.randn(24))
    x = torch.randn(3, 64).to(dtype)
    y = m(x)
    assert y.dtype == dtype
    want = m(x.float()).to(dtype)  # float32 kernel, rounded once to the input's dtype
    assert torch.equal(y, want)


def test_int4_asym_g32_is_q4_1_with_the_same_values():
    w = np.random.default_rng(3).standard_normal((40, 96)).astype(np.float32)
    asym = quantrs.Int4AsymWeight.quantize(w, group_size=32)
    m = GgufLinear(asym)
    assert m.weight_type == "q4_1" and m.qweight.numel() == asym.nbytes
    np.testing.assert_array_equal(m.dequantize().numpy(), asym.dequantize())
    decoded = gguf.quants.dequantize(m.qweight.numpy(), _TYPES["q4_1"]).reshape(40, 96)
    np.testing.assert_array_equal(decoded, asym.dequantize())
    wide = GgufLinear(quantrs.Int4AsymWeight.quantize(w, group_size=64))
    assert wide.qweight is None and wide.weight_packed.group_size == 64


def test_bad_inputs_raise_and_name_the_argument():
    m = GgufLinear(_weight("q8_0", 8, 64))
    with pytest.raises(quantrs.InvalidArgument, match="in_features=64"):
        m(torch.randn(2, 32))
    with pytest.raises(TypeError, match="floating-point"):
        m(torch.ones(2, 64, dtype=torch.int32))
    data = m.qweight.numpy()
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(quantrs.InvalidArgument, match="type"):
        quantrs._core.gguf_linear(x, data, "q9_9", 64, None)
    with pytest.raises(quantrs.QuantError, match="in_feat"):
        quantrs._core.gguf_linear(x, data, "q8_0", 48, None)
    with pytest.raises(quantrs.QuantError, match="data"):
        quantrs._core.gguf_linear(x, data.reshape(-1)[:-1].copy(), "q8_0", 64, None)
    with pytest.raises(quantrs.QuantError, match="bias"):
        quantrs._core.gguf_linear(x, data, "q8_0", 64, np.zeros(7, np.float32))
    with pytest.raises(TypeError, match="data"):
        quantrs._core.gguf_linear(x, data.astype(np.int8), "q8_0", 64, None)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = GgufLinear(_weight("q8_0", 64, 96, seed=4), torch.randn(64))
        self.b = GgufLinear(_weight("q4_1", 40, 64, seed=5))

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_compile_no_graph_break_bit_for_bit_grad_and_export():
    assert_compiles_like_eager(_Mlp(), torch.randn(3, 96), "gguf_linear")


def test_grad_input_matches_dense_weight():
    m = GgufLinear(_weight("q5_0", 24, 256), torch.randn(24))
    x = torch.randn(2, 3, 256, requires_grad=True)
    g = torch.randn(2, 3, 24)
    m(x).backward(g)
    w = m.dequantize().double()
    torch.testing.assert_close(x.grad.double(), g.double() @ w, rtol=1e-5, atol=1e-4)


def test_llama_int4_asym_block_compiles_without_breaks_from_our_layers():
    model = tiny_llama(seed=6)
    qt.quantize_(model, "int4_asym", 32)
    layers = [m for m in model.modules() if isinstance(m, GgufLinear)]
    assert len(layers) == 14 and all(m.weight_type == "q4_1" for m in layers)
    ids = torch.randint(0, 96, (1, 8))
    assert_model_compiles_like_eager(model, ids, ("GgufLinear",))
    bf = model.to(torch.bfloat16)
    with torch.no_grad():
        assert bf(ids, use_cache=False).logits.dtype == torch.bfloat16
