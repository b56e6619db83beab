"""``quantrs.torch.GgufLinear`` against ``torch.nn.functional.linear`` on the
dequantized weight, and the q / k row order against transformers' own GGUF
un-permutation."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

import quantrs  # noqa: E402
from quantrs.torch import GgufLinear  # noqa: E402
from quantrs.torch._gguf import llama_row_order  # noqa: E402


def q8_weight(out: int, inf: int) -> quantrs.GgufWeight:
    w = np.random.default_rng(0).standard_normal((out, inf)).astype(np.float32)
    blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    return quantrs.GgufWeight.from_bytes("q8_0", (out, inf), blocks)


@pytest.mark.kernel
def test_gguf_linear_matches_f_linear():
    w = q8_weight(24, 64)
    bias = torch.randn(24)
    order = np.random.default_rng(1).permutation(24)
    m = GgufLinear(w, bias, order)
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    wd = torch.from_numpy(w.dequantize()).double()[torch.as_tensor(order)]
    want = torch.nn.functional.linear(x.float().double(), wd, bias.double())
    y = m(x)
    assert y.dtype == torch.float64 and y.shape == (3, 5, 24)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-4)


def test_row_order_is_transformers_reverse_permute():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    proc = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 2})
    w = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    for name, heads in (("blk.0.attn_q.weight", 4), ("blk.0.attn_k.weight", 2)):
        want = proc.process(w, name).weights
        np.testing.assert_array_equal(w[llama_row_order(64, heads)], want)
