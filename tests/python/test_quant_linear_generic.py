"""`quantrs.QuantLinear`: one layer class for any registered format.

Built from a format name, it computes what the named classes compute for their
formats (same bytes, same forward), its bytes read back through any layer
class, and bad arguments raise `quantrs` errors naming them.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantrs


def _weight(out: int = 6, inf: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((out, inf)).astype(np.float32)


def test_int8_matches_the_named_class_and_a_numpy_reference() -> None:
    w, b = _weight(), np.linspace(-1, 1, 6, dtype=np.float32)
    layer = quantrs.QuantLinear(w, "INT8", b)
    named = quantrs.Int8Linear.from_float(w, b)
    assert layer.format == "int8"
    assert layer.serialize() == named.serialize()
    x = _weight(3, 64, seed=1)
    # Reference: per-row absmax int8, ties to even (NumPy's rint).
    s = np.abs(w).max(axis=1) / np.float32(127)
    q = np.clip(np.rint(w / s[:, None]), -127, 127)
    ref = x.astype(np.float64) @ (q * s[:, None]).T.astype(np.float64) + b
    np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(layer.forward(x), named.forward(x))


@pytest.mark.parametrize(
    ("fmt", "cls"),
    [
        ("float32", quantrs.UnquantLinear),
        ("int8", quantrs.Int8Linear),
        ("int4", quantrs.Int4Linear),
        ("fp8_e4m3", quantrs.PerTensorFP8Linear),
    ],
)
def test_bytes_read_back_as_the_formats_class(fmt: str, cls: type) -> None:
    layer = quantrs.QuantLinear(_weight(), fmt, group_size=16)
    data = layer.serialize()
    back = quantrs.QuantLinear.deserialize(data)
    assert type(back) is cls
    assert back.serialize() == data
    assert type(pickle.loads(pickle.dumps(layer))) is cls
    assert layer.dtype_and_device() == back.dtype_and_device()


def test_int4_group_size_reaches_the_format() -> None:
    w = _weight()
    layer = quantrs.QuantLinear(w, "int4", group_size=16)
    named = quantrs.Int4Linear.from_float(w, group_size=16)
    assert layer.serialize() == named.serialize()
    np.testing.assert_array_equal(layer.dequantize_w(), named.dequantize_w())


def test_bad_arguments_raise_quantrs_errors_naming_them() -> None:
    w = _weight()
    with pytest.raises(quantrs.QuantError, match="format"):
        quantrs.QuantLinear(w, "no-such-format")
    with pytest.raises(quantrs.QuantError, match="weight"):
        quantrs.QuantLinear(w[0], "int8")
    with pytest.raises(quantrs.QuantError, match="bias"):
        quantrs.QuantLinear(w, "int8", np.ones(5, np.float32))
    with pytest.raises(TypeError):
        quantrs.QuantLinear(w, 8)  # type: ignore[arg-type]
    with pytest.raises(quantrs.QuantError, match="dtype"):
        quantrs.UnquantLinear(w).apply_isq("no-such-format")
