"""Every quantized module of ``quantrs.torch`` is a custom operator with a fake
implementation: a transformers Llama decoder block (small config, no download) holding it
is captured by ``torch._dynamo`` in one graph with zero graph breaks, compiled output
equals eager bit for bit, and the input gradient of the packed-object path
(``quantrs::packed_linear``: ``int4_asym`` of group 64 / 128, GPTQ / AWQ ``IntZpWeight``)
matches the dequantized weight."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _compile_check import assert_compiles_like_eager  # noqa: E402
from torch import nn  # noqa: E402

import quantrs  # noqa: E402
import quantrs.torch as qt  # noqa: E402

# hidden 128 and intermediate 256 so that every linear's input width is a multiple of 128
_CFG = dict(
    vocab_size=64,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)


def _zp(child: nn.Linear) -> nn.Module:
    w = child.weight.detach().numpy()
    return qt.GgufLinear(quantrs.IntZpWeight.quantize(w, group_size=64), child.bias)


def _gguf_q8_0(child: nn.Linear) -> nn.Module:
    gguf = pytest.importorskip("gguf")
    w = child.weight.detach().numpy()
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return qt.GgufLinear(quantrs.GgufWeight.from_bytes("q8_0", w.shape, raw), child.bias)


# name -> how the block's linears are quantized (quantize_ arguments, or a per-layer
# constructor), and the layer class that must appear.
_FORMATS = {
    "int4_g32": (("int4", 32), {}, qt.Int4Linear),
    "int4_g128": (("int4", 128), {}, qt.Int4Linear),
    "int4_int8_activations": (("int4", 32), {"activations": "int8"}, qt.Int4Linear),
    "int8": (("int8",), {}, qt.Int8Linear),
    "fp8_w8a32": (("fp8",), {}, qt.FP8Linear),
    "fp8_w8a8": (("fp8",), {"activation_scale": 0.05}, qt.FP8Linear),
    "int4_asym_g32": (("int4_asym", 32), {}, qt.GgufLinear),
    "int4_asym_g128": (("int4_asym", 128), {}, qt.GgufLinear),
    "gguf_q8_0": (_gguf_q8_0, {}, qt.GgufLinear),
    "int_zp_g64": (_zp, {}, qt.GgufLinear),
}


def _quantized_block(fmt: str):
    """A Llama decoder layer with its seven linears quantized as ``fmt``, and the
    inputs of one call: hidden states and the rotary ``(cos, sin)``."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_CFG)).eval()
    how, kw, cls = _FORMATS[fmt]
    block = model.model.layers[0]
    if callable(how):
        for parent in (block.self_attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, how(child))
    else:
        qt.quantize_(block, *how, **kw)
    assert sum(isinstance(m, cls) for m in block.modules()) == 7
    assert not any(type(m) is nn.Linear for m in block.modules())
    h = torch.randn(1, 6, _CFG["hidden_size"])
    pos = torch.arange(6)[None]
    return block, h, model.model.rotary_emb(h, pos)


class _Block(nn.Module):
    """The decoder layer as ``hidden -> hidden`` (what dynamo traces)."""

    def __init__(self, block: nn.Module, rope: tuple) -> None:
        super().__init__()
        self.block, self.rope = block, rope

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.block(h, position_embeddings=self.rope, attention_mask=None)
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("fmt", list(_FORMATS))
@torch.no_grad()
def test_llama_block_has_zero_graph_breaks_and_compiles_bit_for_bit(fmt):
    block, h, rope = _quantized_block(fmt)
    m = _Block(block, rope)
    eager = m(h)
    explain = torch._dynamo.explain(m)(h)
    assert explain.graph_break_count == 0, [str(b.reason) for b in explain.break_reasons]
    assert explain.graph_count == 1
    ops = {str(n.target) for g in explain.graphs for n in g.graph.nodes}
    assert any("quantrs" in t for t in ops), ops
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(h), eager)
    # a second input, to hit the compiled graph rather than the first call's trace
    h2 = torch.randn_like(h)
    assert torch.equal(compiled(h2), m(h2))


def _packed_layers():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 256)).astype(np.float32)
    order = rng.permutation(48)
    return {
        "int4_asym_g128": qt.GgufLinear(
            quantrs.Int4AsymWeight.quantize(w, group_size=128), torch.randn(48)
        ),
        "int4_asym_g64_reordered": qt.GgufLinear(
            quantrs.Int4AsymWeight.quantize(w, group_size=64), torch.randn(48), order
        ),
        "int_zp_g128": qt.GgufLinear(quantrs.IntZpWeight.quantize(w, group_size=128)),
    }


@pytest.mark.parametrize("name", list(_packed_layers()))
def test_packed_object_layers_are_one_op_like_eager_with_grad_and_export(name):
    layer = _packed_layers()[name]
    assert layer.qweight is None  # no GGUF block form: the weight object runs the op
    assert_compiles_like_eager(layer, torch.randn(3, 256), "packed_linear")


@pytest.mark.parametrize("name", list(_packed_layers()))
def test_packed_object_layers_match_the_dequantized_weight(name):
    layer = _packed_layers()[name]
    w = layer.dequantize().double()  # rows in out_index order
    b = None if layer.bias is None else layer.bias.double()
    x = torch.randn(2, 3, 256, requires_grad=True)
    y = layer(x)
    ref = nn.functional.linear(x.detach().double(), w, b)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4)
    g = torch.randn(2, 3, 48)
    y.backward(g)
    torch.testing.assert_close(x.grad.double(), g.double() @ w, rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        assert layer(x.detach().bfloat16()).dtype == torch.bfloat16


def test_packed_table_entry_goes_with_the_module():
    from quantrs.torch import _gguf_op

    layer = _packed_layers()["int_zp_g128"]
    key = layer._key
    assert _gguf_op._PACKED[key] is layer.weight_packed
    del layer
    import gc

    gc.collect()
    assert key not in _gguf_op._PACKED
