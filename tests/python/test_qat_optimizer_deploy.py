"""quantrs.QatOptimizer(grid="deploy"): the view is, bit for bit, the dequantized weight
of the serving layer built from the master (QuantizedWeight, Int8Linear,
PerTensorFP8Linear), after every step; and quantrs.torch.Int8Linear's codes and scales
against NumPy's per-channel rule."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantrs

OUT, IN = 12, 80


def _served(target: str, gs: int, w: np.ndarray) -> np.ndarray:
    """The serving layer's weight for the float32 master ``w`` ``[out, in]``."""
    w32 = np.ascontiguousarray(w, np.float32)
    if target == "int4":
        qw = quantrs.QuantizedWeight.quantize(
            np.ascontiguousarray(w32.T), group_size=gs, method="rtn"
        )
        return np.ascontiguousarray(qw.dequantize().T)
    if target == "int8":
        return np.asarray(quantrs.Int8Linear.from_float(w32).dequantize_w())
    return np.asarray(quantrs.PerTensorFP8Linear.from_float(w32).dequantize_w())


def _int8_ref(w: np.ndarray) -> np.ndarray:
    """src/format/int8.rs, written out: ``s[o] = absmax(W[o]) / 127``, codes
    ``round_half_even(W / s)``."""
    s = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
    return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)


CASES = [("int4", 16), ("int4", 32), ("int8", 32), ("fp8_e4m3", 32)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("target,gs", CASES)
def test_view_is_the_served_weight_after_every_step(target, gs, dtype):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((OUT, IN)) * np.arange(1, OUT + 1)[:, None]).astype(dtype)
    opt = quantrs.QatOptimizer(
        w, quantrs.QatConfig(target, lr=1e-2), rng=1, grid="deploy", group_size=gs
    )
    assert (opt.grid, opt.group_size, opt.quant_params()) == ("deploy", gs, None)
    for _ in range(3):
        want = _served(target, gs, w).astype(dtype)
        np.testing.assert_array_equal(opt.quantized_weights, want)
        opt.step(w, rng.standard_normal((OUT, IN)).astype(dtype))
    if target == "int8":  # the served rule itself, against NumPy
        np.testing.assert_allclose(
            opt.quantized_weights, _int8_ref(w.astype(np.float32)), rtol=1e-6, atol=0
        )
    back = pickle.loads(pickle.dumps(opt))
    assert (back.grid, back.group_size) == ("deploy", gs)
    np.testing.assert_array_equal(back.quantized_weights, opt.quantized_weights)


def test_tensor_grid_stays_the_default():
    w = np.random.default_rng(1).standard_normal((OUT, IN))
    opt = quantrs.QatOptimizer(w, "int4", rng=0)
    assert (opt.grid, opt.group_size) == ("tensor", None)
    deploy = quantrs.QatOptimizer(w, "int4", rng=0, grid="deploy")
    assert opt.quant_params() is not None
    assert not np.array_equal(opt.quantized_weights, deploy.quantized_weights)


@pytest.mark.parametrize(
    "master,config,kwargs,exc,match",
    [
        (np.ones(8), "int4", {"grid": "deploy"}, quantrs.InvalidArgument, "2-D"),
        (np.ones((2, 4)), "int4", {"grid": "serving"}, quantrs.InvalidArgument, "grid"),
        (
            np.ones((2, 4)),
            "int4",
            {"grid": "deploy", "group_size": 3},
            quantrs.InvalidArgument,
            "group_size",
        ),
        (np.ones((2, 4)), "fp8_e5m2", {"grid": "deploy"}, quantrs.InvalidArgument, "fp8_e5m2"),
        (
            np.ones((2, 4)),
            quantrs.QatConfig("int8", scheme="affine"),
            {"grid": "deploy"},
            quantrs.InvalidArgument,
            "scheme",
        ),
        (
            np.ones((2, 4)),
            quantrs.QatConfig("int8", rounding="stochastic"),
            {"grid": "deploy"},
            quantrs.InvalidArgument,
            "rounding",
        ),
    ],
)
def test_bad_deploy_settings_raise(master, config, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        quantrs.QatOptimizer(master, config, rng=0, **kwargs)


def test_stochastic_rounding_is_refused_on_a_live_deploy_optimizer():
    w = np.random.default_rng(2).standard_normal((OUT, IN))
    opt = quantrs.QatOptimizer(w, "int8", rng=0, grid="deploy")
    with pytest.raises(quantrs.InvalidArgument, match="rounding"):
        opt.set_rounding("stochastic")
    assert opt.config.rounding == quantrs.RoundingMode.NEAREST


def test_from_bytes_checks_the_deploy_shape():
    w = np.random.default_rng(3).standard_normal((OUT, IN))
    opt = quantrs.QatOptimizer(w, "int4", rng=0, grid="deploy")
    with pytest.raises(quantrs.SerializationError, match="deploy grid"):
        quantrs.QatOptimizer.from_bytes(opt.to_bytes(), (IN, OUT))


def test_torch_int8_linear_codes_and_scales_against_numpy():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    lin = torch.nn.Linear(IN, OUT)
    m = qt.Int8Linear.from_linear(lin)
    w = lin.weight.detach().numpy()
    s = np.abs(w).max(axis=1) / np.float32(127)
    np.testing.assert_allclose(m.scales.numpy(), s, rtol=1e-7)
    np.testing.assert_array_equal(m.weight.numpy(), np.round(w / s[:, None]).astype(np.int8))
    x = torch.randn(3, IN)
    ref = x.double() @ m.dequantize().double().T + lin.bias.detach().double()
    np.testing.assert_allclose(m(x).double().numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    assert "Int8Linear" in repr(qt.quantize_(torch.nn.Sequential(lin), "int8"))
