"""apply_isq targets (float32, int8, fp8, int4) and their shared QuantMethod surface."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _helpers import rand

import quantrs
from quantrs import Int4Linear, Int8Linear, PerTensorFP8Linear, QuantizedWeight, UnquantLinear
from quantrs.reference import _fake_quantize_int4


def check_forward(layer, w_eff, bias=None, shape=(5, None)):
    x = rand((shape[0], w_eff.shape[1]), 11)
    ref = x.astype(np.float64) @ w_eff.astype(np.float64).T
    if bias is not None:
        ref += bias
    y = layer.forward(x)
    tol = 1e-5 * np.abs(x.astype(np.float64)) @ np.abs(w_eff.astype(np.float64)).T + 1e-5
    assert np.all(np.abs(y - ref) <= tol)
    y1 = layer.forward(x[0])
    assert y1.shape == (w_eff.shape[0],)
    assert np.all(np.abs(y1 - ref[0]) <= tol[0])


def int8_reference(w):
    s = np.abs(w).max(axis=1) / np.float32(127)
    s = np.where(s > 0, s, 1).astype(np.float32)
    q = np.clip(np.round(w / s[:, None]), -127, 127)
    return q.astype(np.int8), s


@pytest.fixture
def fp8_layer():
    return PerTensorFP8Linear.from_float(rand((24, 70), 1), bias=rand(24, 2))


@pytest.mark.kernel
def test_isq_none_gives_float32(fp8_layer):
    u = fp8_layer.apply_isq(None)
    assert isinstance(u, UnquantLinear)
    assert u.dtype_and_device() == ("float32", "cpu")
    np.testing.assert_array_equal(u.weight, fp8_layer.dequantize_w())
    check_forward(u, u.weight, u.bias)
    assert u.name() == "unquant-linear" and u.quantized_act_type() is None


@pytest.mark.kernel
def test_isq_int8_per_row(fp8_layer):
    q = fp8_layer.apply_isq("int8")
    assert isinstance(q, Int8Linear)
    w = fp8_layer.dequantize_w()
    qr, sr = int8_reference(w)
    np.testing.assert_array_equal(q.q, qr)
    assert np.shares_memory(q.q, q.q) and not q.scales.flags.writeable
    np.testing.assert_array_equal(q.scales, sr)
    np.testing.assert_array_equal(q.dequantize_w(), qr.astype(np.float32) * sr[:, None])
    check_forward(q, q.dequantize_w(), q.bias)
    assert q.dtype_and_device() == ("int8", "cpu")


@pytest.mark.kernel
def test_isq_fp8_rescaled(fp8_layer):
    u = fp8_layer.apply_isq(None)
    f = u.apply_isq("fp8_e4m3")
    assert isinstance(f, PerTensorFP8Linear)
    assert f.weight_scale_inv == pytest.approx(np.abs(u.weight).max() / 448, rel=1e-6)
    again = fp8_layer.apply_isq("fp8_e4m3")
    np.testing.assert_array_equal(again.dequantize_w(), f.dequantize_w())
    act = PerTensorFP8Linear.from_float(rand((4, 8), 3), activation_scale=0.5)
    assert act.apply_isq("fp8_e4m3").activation_scale == 0.5


@pytest.mark.kernel
def test_isq_int4_matches_reference(fp8_layer):
    q = fp8_layer.apply_isq("int4", group_size=32)
    assert isinstance(q, Int4Linear)
    w = fp8_layer.dequantize_w()
    ref = _fake_quantize_int4(w.T.copy(), 32).T
    np.testing.assert_array_equal(q.dequantize_w(), ref)
    check_forward(q, ref, q.bias)
    assert q.dtype_and_device() == ("int4", "cpu")
    assert isinstance(q.qweight, QuantizedWeight) and q.qweight.group_size == 32
    q16 = fp8_layer.apply_isq("int4", group_size=16)
    assert q16.qweight.group_size == 16


def test_isq_int4_imatrix_lowers_weighted_error():
    w = rand((32, 128), 5)
    layer = UnquantLinear(w)
    x = rand((64, 128), 6) * np.linspace(0.05, 3, 128, dtype=np.float32)
    layer.begin_track_stats()
    layer.forward(x)
    im = layer.end_track_stats()
    plain = layer.apply_isq("int4")
    weighted = layer.apply_isq("int4", "cpu", im)

    def werr(q):
        return float((((q.dequantize_w() - w) ** 2) * im).sum())

    assert werr(weighted) < werr(plain)
    # and the output error on the calibration data follows
    e_plain = np.linalg.norm(plain.forward(x) - layer.forward(x))
    e_weighted = np.linalg.norm(weighted.forward(x) - layer.forward(x))
    assert e_weighted < e_plain
    with pytest.raises(quantrs.DimensionMismatch):
        layer.apply_isq("int4", "cpu", im[:-1])
    with pytest.raises(ValueError, match="imatrix"):
        layer.apply_isq("int4", "cpu", -im)
    with pytest.raises(ValueError, match="int4"):
        layer.apply_isq("int8", "cpu", im)


def test_isq_bad_arguments(fp8_layer):
    with pytest.raises(ValueError, match="dtype"):
        fp8_layer.apply_isq("int3")
    with pytest.raises(ValueError, match="device"):
        fp8_layer.apply_isq("int8", "tpu")
    with pytest.raises(quantrs.CudaNotAvailable):
        fp8_layer.apply_isq("int8", "cuda:0")
    stacked = PerTensorFP8Linear.from_float(rand((2, 4, 8), 1))
    with pytest.raises(quantrs.UnsupportedOperation):
        stacked.apply_isq("int8")
    assert stacked.apply_isq("fp8_e4m3").weight_shape == (2, 4, 8)


@pytest.mark.parametrize("target", [None, "int8", "int4", "fp8_e4m3"])
def test_every_target_has_the_whole_surface(fp8_layer, target):
    layer = fp8_layer.apply_isq(target)
    x = rand((3, 70), 4)
    y = layer(x)
    assert y.shape == (3, 24)
    # serialization round trip, bit exact, and pickling
    blob = layer.serialize()
    back = type(layer).deserialize(blob)
    assert type(back) is type(layer) and back.serialize() == blob
    assert np.array_equal(back.forward(x), y)
    assert pickle.loads(pickle.dumps(layer)).serialize() == blob
    lay2, b2 = type(layer).deserialize_ext_bias(layer.serialize_with_bias(np.ones(24)))
    assert lay2.bias is None and np.array_equal(b2, np.ones(24, np.float32))
    # LoRA merge
    delta = rand((24, 70), 9, 0.05)
    merged = layer.add_delta_w(delta)
    assert type(merged) is type(layer) and merged.merge_error is not None
    target_w = layer.dequantize_w() + delta
    err = np.linalg.norm(merged.dequantize_w() - target_w) / np.linalg.norm(target_w)
    assert merged.merge_error == pytest.approx(err, rel=1e-5, abs=1e-12)
    # autocast, stats, misc
    assert layer.forward_autocast(x.astype(np.float16)).dtype == np.float16
    layer.begin_track_stats()
    layer.forward(x)
    np.testing.assert_allclose(layer.end_track_stats(), (x.astype(np.float64) ** 2).mean(0), 1e-6)
    assert layer.is_distributed() is None and layer.isq_serde_supported()
    assert layer.unquant_weight_bias()[0].shape == (24, 70)
    assert repr(layer).startswith(type(layer).__name__ + "(")
    with pytest.raises(NotImplementedError):
        layer.gather_forward(x, np.zeros((3, 1), np.int64))
    with pytest.raises(quantrs.DimensionMismatch):
        layer.forward(rand((3, 69), 1))


def test_other_constructors_validate():
    w = rand((4, 6), 1)
    with pytest.raises(ValueError, match="weight"):
        UnquantLinear(np.full((4, 6), np.nan, np.float32))
    with pytest.raises(quantrs.DimensionMismatch):
        UnquantLinear(np.ones(6, np.float32))
    q, s = int8_reference(w)
    lay = Int8Linear(q, s, bias=np.zeros(4))
    np.testing.assert_array_equal(lay.q, q)
    with pytest.raises(TypeError, match="int8"):
        Int8Linear(q.astype(np.int16), s)
    with pytest.raises(ValueError, match="scales"):
        Int8Linear(q, np.zeros(4, np.float32))
    with pytest.raises(quantrs.DimensionMismatch):
        Int8Linear(q, s[:3])
    qw = QuantizedWeight.quantize(w.T.copy(), group_size=2, method="rtn")
    i4 = Int4Linear(qw, bias=np.ones(4))
    np.testing.assert_array_equal(i4.dequantize_w(), qw.dequantize().T)
    with pytest.raises(quantrs.DimensionMismatch):
        Int4Linear(qw, bias=np.ones(6))
    with pytest.raises(TypeError):
        Int4Linear(w)
