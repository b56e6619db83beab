"""``quantize_(model, "q4_0" ... "q6_k")``: ``GgufLinear`` layers over llama.cpp's
quantization of each weight (``GgufWeight.quantize``'s bytes), llama.cpp's fallback for
widths the type's block does not divide, the float layer kept where no block fits; the
forward against a float64 product with the dequantized reference weight; calibration
importance (mean ``x^2`` per input, computed here in NumPy) weighs the quantizer; bad
arguments raise naming them."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
from quantrs import GgufWeight

torch = pytest.importorskip("torch")

from quantrs.torch import GgufLinear, quantize_  # noqa: E402

TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
# llama.cpp's tensor_type_fallback (src/llama-quant.cpp), written out here on its own
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
EPS = float(np.finfo(np.float32).eps)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    lin = torch.nn.Linear
    # 512 inputs fit every type, 32 only the 32-blocks, 40 none
    return torch.nn.Sequential(lin(512, 32), torch.nn.ReLU(), lin(32, 40), torch.nn.ReLU(),
                               lin(40, 8)).eval()  # fmt: skip


def _check_forward(layer: GgufLinear, deq: np.ndarray, bias: np.ndarray, x: torch.Tensor):
    """``layer(x)`` against ``x @ deq.T + bias`` in float64, within the float32 rounding
    of a sum of ``in`` products."""
    with torch.no_grad():
        y = layer(x).double().numpy()
    xd = x.double().numpy()
    want = xd @ deq.astype(np.float64).T + bias
    bound = (deq.shape[1] + 1) * EPS * (np.abs(xd) @ np.abs(deq.astype(np.float64)).T
                                        + np.abs(bias))  # fmt: skip
    assert np.all(np.abs(y - want) <= bound)


@pytest.mark.parametrize("gtype", TYPES)
def test_layers_hold_ggml_bytes_and_fall_back_as_llama_cpp(gtype):
    model = _model()
    floats = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
              for m in model if isinstance(m, torch.nn.Linear)]  # fmt: skip
    last = model[4]
    quantize_(model, gtype)
    assert model[4] is last  # 40 inputs: no ggml block; llama.cpp writes F16, we keep float
    x = torch.randn(3, 512)
    for idx, used, (w, b) in ((0, gtype, floats[0]), (2, FALLBACK.get(gtype, gtype), floats[1])):
        layer = model[idx]
        assert isinstance(layer, GgufLinear) and layer.weight_type == used
        ref = GgufWeight.quantize(w, used)
        np.testing.assert_array_equal(
            layer.qweight.numpy(), np.asarray(ref.to_bytes()).reshape(w.shape[0], -1)
        )
        _check_forward(layer, ref.dequantize(), b.astype(np.float64), x[:, : w.shape[1]])
    with torch.no_grad():
        assert model(x).shape == (3, 8)


def test_calibration_importance_weighs_the_quantizer():
    model = _model(seed=1)
    w0 = model[0].weight.detach().numpy().copy()
    g = torch.Generator().manual_seed(5)
    # inputs of very different scales, so that the importance moves codes
    batches = [torch.randn(4, 512, generator=g) * torch.linspace(0.01, 3, 512) for _ in range(3)]
    imp = np.mean(np.concatenate([b.numpy() for b in batches]).astype(np.float64) ** 2, axis=0)
    quantize_(model, "q4_k", calibration=batches)
    got = model[0].qweight.numpy().reshape(-1)
    want = GgufWeight.quantize(w0, "q4_k", importance=imp.astype(np.float32)).to_bytes()
    plain = GgufWeight.quantize(w0, "q4_k").to_bytes()
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, plain)


def test_bad_arguments_are_named():
    with pytest.raises(quantrs.QuantError, match=r"method: .*'q4_k'.*got 'q3_k'"):
        quantize_(_model(), "q3_k")
    model = _model()
    first = model[0]
    with pytest.raises(quantrs.QuantError, match=r"quantizer: .*got 'search'"):
        quantize_(model, "q4_k", quantizer="search")
    assert model[0] is first  # nothing replaced
    for method in ("q4_0", "q6_k", "int4_k"):  # fixed blocks: group_size is not theirs
        with pytest.raises(quantrs.QuantError, match=r"group_size: .*got 128"):
            quantize_(model, method, 128)
        assert model[0] is first
    with pytest.raises(quantrs.QuantError, match="importance"):
        GgufWeight.quantize(np.ones((2, 256), np.float32), "q4_k", importance=np.ones(3))
