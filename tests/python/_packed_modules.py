"""The model, calibration and checks that test_int4_asym.py and test_int4_k.py share
for ``quantrs.torch.quantize_`` routing a format to a packed ``GgufLinear``."""

from __future__ import annotations

import numpy as np


def two_layer_model(torch):
    """Linear(64, 16) - ReLU - Linear(16, 8) under seed 0, a copy of its first weight,
    two calibration batches and their importance (each input's mean x^2, from float64)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    w0 = model[0].weight.detach().numpy().copy()
    calib = [torch.randn(4, 64) for _ in range(2)]
    want = np.concatenate([c.numpy() for c in calib]).astype(np.float64)
    imp = (want**2).mean(0).astype(np.float32)
    return model, w0, calib, imp


def only_first(_module, name: str) -> bool:
    """The ``filter_fn`` that quantizes the model's first layer only."""
    return name == "0"


def assert_first_layer_is_packed(torch, model, ref) -> None:
    """``model[0]`` is a ``GgufLinear`` holding ``ref``'s weight exactly (``model[2]`` left
    alone), and its forward is ``x @ W.T + bias`` against a float64 product."""
    import quantrs.torch as qt

    layer = model[0]
    assert isinstance(layer, qt.GgufLinear) and isinstance(model[2], torch.nn.Linear)
    np.testing.assert_array_equal(layer.weight_packed.dequantize(), ref.dequantize())
    x = torch.randn(3, 64)
    exact = x.numpy().astype(np.float64) @ ref.dequantize().T.astype(np.float64)
    np.testing.assert_allclose(
        layer(x).numpy(), exact + layer.bias.detach().numpy(), rtol=1e-5, atol=1e-5
    )
