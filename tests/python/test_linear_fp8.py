"""PerTensorFP8Linear: every method against float64 NumPy references."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from _helpers import rand
from hypothesis import given, settings
from hypothesis import strategies as st

import quantrs
from quantrs import PerTensorFP8Linear, fp8
from quantrs.reference import fp8_linear_forward, fp8_round


def bound(x, w):
    """Accumulation-error bound per output: f32 rounding of a dot of len k."""
    x64 = np.abs(np.asarray(x, np.float64))
    return 2e-6 * x64 @ np.abs(np.asarray(w, np.float64)).T * np.sqrt(w.shape[-1]) + 1e-6


def decoded(layer):
    return fp8.decode(layer.weight, "e4m3").astype(np.float64)


@pytest.mark.kernel
@pytest.mark.parametrize("shape", [(1, 64), (3, 37), (5, 129), (2, 3, 96), (130, 33)])
@pytest.mark.parametrize("act", [None, 0.05])
def test_forward_matches_reference(shape, act):
    out_f = 19
    w = rand((out_f, shape[-1]), 1)
    b = rand(out_f, 2)
    layer = PerTensorFP8Linear.from_float(w, bias=b, activation_scale=act)
    x = rand(shape, 3)
    y = layer.forward(x)
    assert y.shape == shape[:-1] + (out_f,) and y.dtype == np.float32
    wd = decoded(layer)
    ref = fp8_linear_forward(x.reshape(-1, shape[-1]), wd, layer.weight_scale_inv, act, b)
    wfull = wd * layer.weight_scale_inv
    tol = bound(x.reshape(-1, shape[-1]), wfull)
    assert np.all(np.abs(y.reshape(-1, out_f) - ref) <= tol)
    assert np.array_equal(layer(x), y)


@pytest.mark.kernel
def test_w8a8_really_quantizes_activations():
    w = rand((8, 64), 1)
    x = rand((4, 64), 2)
    a = 0.01  # x / a saturates for most elements: results must differ from W8A32
    y8 = PerTensorFP8Linear.from_float(w, activation_scale=a).forward(x)
    y32 = PerTensorFP8Linear.from_float(w).forward(x)
    assert not np.allclose(y8, y32, rtol=1e-2)
    layer = PerTensorFP8Linear.from_float(w, activation_scale=a)
    xq = fp8_round(x / np.float32(a), "e4m3", True) * a
    ref = xq @ (decoded(layer) * layer.weight_scale_inv).T
    np.testing.assert_allclose(y8, ref, rtol=1e-5, atol=1e-5)


def test_big_layer_both_paths():
    w = rand((256, 512), 4)
    layer = PerTensorFP8Linear.from_float(w)
    x = rand((16, 512), 5)
    y = layer.forward(x)
    ref = fp8_linear_forward(x, decoded(layer), layer.weight_scale_inv)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    y1 = np.stack([layer.forward(x[i]) for i in range(4)])  # batch-1 path
    np.testing.assert_allclose(y1, ref[:4], rtol=1e-4, atol=1e-4)


@pytest.mark.kernel
@pytest.mark.parametrize("act", [None, 0.02])
def test_small_batch_is_the_same_under_every_thread_cap(act):
    # 1001 output rows (tasks of 64 rows, the 4-row kernel's groups and a
    # remainder) and a depth with a tail: bit-identical under quantrs.threads(1)
    # and the whole pool, and within the float32 bound of the float64 reference.
    w = rand((1001, 577), 6)
    layer = PerTensorFP8Linear.from_float(w, activation_scale=act)
    wd = decoded(layer)
    for rows in (1, 3):
        x = rand((rows, 577), 7 + rows)
        y = layer.forward(x)
        with quantrs.threads(1):
            y1 = layer.forward(x)
        assert np.array_equal(y, y1)
        ref = fp8_linear_forward(x, wd, layer.weight_scale_inv, act)
        xs = x if act is None else fp8_round(x / np.float32(act), "e4m3", True) * act
        assert np.all(np.abs(y - ref) <= bound(xs, wd * layer.weight_scale_inv))


@pytest.mark.kernel
@pytest.mark.parametrize("rows", [8, 17, 40, 128])
@pytest.mark.parametrize("act", [None, 0.05])
def test_batched_forward_matches_reference(rows, act):
    # From 8 rows the AMX tile path runs where the CPU has it
    # (build_info()["amx"]), else the FMA engine: the same bound holds.
    w = rand((70, 1100), 6)  # 3 tasks of 32 rows, inputs past a 512 chunk and not a multiple of 32
    b = rand(70, 7)
    layer = PerTensorFP8Linear.from_float(w, bias=b, activation_scale=act)
    x = rand((rows, 1100), 8) * np.float32(3.0)
    y = layer.forward(x)
    ref = fp8_linear_forward(x, decoded(layer), layer.weight_scale_inv, act, b)
    assert np.all(np.abs(y - ref) <= bound(x, decoded(layer) * layer.weight_scale_inv))


@pytest.mark.kernel
@pytest.mark.parametrize("rows", [1, 40, 64, 193])
def test_w8a8_saturates_huge_and_infinite_activations(rows):
    """W8A8 rounds x / s_a onto the E4M3 grid, saturated at 448, before the engine sees it, so
    the engine skips its range check: activations of 3e38 and inf give the outputs of x / s_a
    = +-448 exactly, finite, at batch 1, the tiled rows and the panel GEMM."""
    act = 0.05
    w = rand((70, 200), 11)
    layer = PerTensorFP8Linear.from_float(w, activation_scale=act)
    x = rand((rows, 200), 12)
    big = x.copy()
    clipped = x.copy()
    for i, v in enumerate([3e38, -3e38, np.inf, -np.inf]):
        r, c = (i * 7) % rows, (i * 53) % 200
        big[r, c] = v
        clipped[r, c] = np.float32(448 * act) * np.sign(v)
    y = layer.forward(big)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y, layer.forward(clipped))
    ref = fp8_linear_forward(clipped, decoded(layer), layer.weight_scale_inv, act)
    xs = fp8_round(clipped / np.float32(act), "e4m3", True) * act
    assert np.all(np.abs(y - ref) <= bound(xs, decoded(layer) * layer.weight_scale_inv))


def test_amx_can_be_turned_off():
    code = (
        "import sys, numpy as np, quantrs; print(quantrs.build_info()['amx'], flush=True);"
        "w = np.linspace(-1, 1, 64 * 96, dtype=np.float32).reshape(64, 96);"
        "x = np.linspace(-2, 3, 16 * 96, dtype=np.float32).reshape(16, 96);"
        "np.save(sys.stdout.buffer, quantrs.PerTensorFP8Linear.from_float(w).forward(x))"
    )
    runs = {}
    for amx in ("1", "0"):
        env = dict(os.environ, QUANTRS_AMX=amx)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True)
        flag, _, data = out.stdout.partition(b"\n")
        runs[amx] = (flag.decode(), np.load(io.BytesIO(data)))
    assert runs["0"][0] == "False"
    assert runs["1"][0] == str(quantrs.build_info()["amx"])
    # Both paths sum exact products in f32, in different orders.
    np.testing.assert_allclose(runs["1"][1], runs["0"][1], rtol=1e-5, atol=1e-5)


def test_from_float_scale_and_codes():
    w = rand((6, 10), 7, 3.0)
    layer = PerTensorFP8Linear.from_float(w)
    s = np.float32(np.abs(w).max()) / np.float32(448)
    assert layer.weight_scale_inv == s
    want = fp8.encode(w / s, "e4m3", saturate=True)
    assert np.array_equal(layer.weight, want)
    assert layer.weight.dtype == np.uint8 and layer.weight.shape == (6, 10)
    # a read-only view of the layer's own codes, not a copy per access
    assert np.shares_memory(layer.weight, layer.weight)
    assert not layer.weight.flags.writeable
    with pytest.raises(ValueError):
        layer.weight[0, 0] = 1
    z = PerTensorFP8Linear.from_float(np.zeros((2, 3), np.float32))
    assert z.weight_scale_inv == 1.0 and not z.weight.any()


def test_constructor_and_validation():
    codes = fp8.encode(rand((4, 8), 1))
    layer = PerTensorFP8Linear(codes, 0.5, activation_scale=2.0, bias=np.ones(4))
    assert layer.activation_scale == 2.0 and layer.weight_scale_inv == 0.5
    assert np.array_equal(layer.bias, np.ones(4, np.float32))
    # ml_dtypes codes are accepted as they are.
    l2 = PerTensorFP8Linear(codes.view(ml_dtypes.float8_e4m3fn), 0.5)
    assert np.array_equal(l2.weight, codes)
    for bad in [0.0, -1.0, np.nan, np.inf]:
        with pytest.raises(quantrs.InvalidArgument, match="weight_scale_inv"):
            PerTensorFP8Linear(codes, bad)
        with pytest.raises(quantrs.InvalidArgument, match="activation_scale"):
            PerTensorFP8Linear(codes, 1.0, activation_scale=bad)
    nan_codes = codes.copy()
    nan_codes[1, 2] = 0x7F
    with pytest.raises(ValueError, match=r"weight\[10\]"):
        PerTensorFP8Linear(nan_codes, 1.0)
    with pytest.raises(TypeError, match="from_float"):
        PerTensorFP8Linear(rand((4, 8), 1), 1.0)
    with pytest.raises(quantrs.DimensionMismatch):
        PerTensorFP8Linear(codes.reshape(-1), 1.0)
    with pytest.raises(quantrs.DimensionMismatch, match="bias"):
        PerTensorFP8Linear(codes, 1.0, bias=np.ones(5))
    with pytest.raises(ValueError, match="bias"):
        PerTensorFP8Linear(codes, 1.0, bias=np.array([1, 2, np.nan, 4]))
    with pytest.raises(ValueError, match="weight"):
        PerTensorFP8Linear.from_float(np.array([[1.0, np.inf]], np.float32))
    with pytest.raises(ValueError):
        PerTensorFP8Linear(np.zeros((0, 4), np.uint8), 1.0)


def test_forward_bad_inputs():
    layer = PerTensorFP8Linear.from_float(rand((4, 8), 1))
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        layer.forward(np.ones((2, 7), np.float32))
    with pytest.raises(quantrs.DimensionMismatch):
        layer.forward(np.float32(1.0))
    with pytest.raises(TypeError):
        layer.forward(np.array(["a"] * 8))
    assert layer.forward(np.zeros((0, 8), np.float32)).shape == (0, 4)
    # float64 input is converted (read-only inputs accept any array-like).
    x = rand((2, 8), 2)
    np.testing.assert_array_equal(layer.forward(x.astype(np.float64)), layer.forward(x))


def test_dequantize_unquant_dtype_device():
    w = rand((5, 7), 3)
    b = rand(5, 4)
    layer = PerTensorFP8Linear.from_float(w, bias=b)
    dq = layer.dequantize_w()
    assert dq.dtype == np.float32 and dq.shape == (5, 7)
    np.testing.assert_array_equal(dq, (decoded(layer) * layer.weight_scale_inv).astype(np.float32))
    wq, bq = layer.unquant_weight_bias()
    np.testing.assert_array_equal(wq, dq)
    np.testing.assert_array_equal(bq, b)
    assert layer.dtype_and_device() == ("float8_e4m3fn", "cpu")
    assert layer.quantized_act_type() is None
    assert PerTensorFP8Linear.from_float(w, activation_scale=1.0).quantized_act_type() == (
        "float8_e4m3fn"
    )
    assert layer.is_distributed() is None
    assert layer.name() == "pertensor-fp8-linear" and layer.isq_serde_supported()
    assert (layer.in_features, layer.out_features, layer.weight_shape) == (7, 5, (5, 7))
    assert repr(layer).startswith("PerTensorFP8Linear(weight=<float8_e4m3fn [5, 7]>")


def test_add_delta_w_reports_merge_error():
    w = rand((16, 32), 1)
    layer = PerTensorFP8Linear.from_float(w, bias=np.ones(16, np.float32), activation_scale=0.5)
    assert layer.merge_error is None
    delta = rand((16, 32), 2, 0.1)
    merged = layer.add_delta_w(delta)
    assert isinstance(merged, PerTensorFP8Linear)
    target = layer.dequantize_w().astype(np.float64) + delta
    target32 = target.astype(np.float32).astype(np.float64)
    got = merged.dequantize_w().astype(np.float64)
    want_err = np.linalg.norm(target32 - got) / np.linalg.norm(target32)
    assert merged.merge_error == pytest.approx(want_err, rel=1e-6)
    assert 0 < merged.merge_error < 0.05
    assert merged.weight_scale_inv == pytest.approx(np.abs(target32).max() / 448, rel=1e-6)
    assert merged.activation_scale == 0.5 and np.array_equal(merged.bias, layer.bias)
    with pytest.raises(quantrs.DimensionMismatch):
        layer.add_delta_w(np.ones((16, 31), np.float32))
    with pytest.raises(ValueError, match="delta"):
        layer.add_delta_w(np.full((16, 32), np.nan, np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, ml_dtypes.bfloat16])
def test_forward_autocast(dtype):
    layer = PerTensorFP8Linear.from_float(rand((6, 16), 1), activation_scale=0.05)
    x = rand((3, 16), 2).astype(dtype)
    y = layer.forward_autocast(x)
    assert y.dtype == np.dtype(dtype) and y.shape == (3, 6)
    ref = layer.forward(x.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(y, ref)
    with pytest.raises(TypeError):
        layer.forward_autocast(np.ones((3, 16), np.int32))


def test_gather_forward_experts():
    e, out_f, in_f, tokens, k = 4, 12, 40, 9, 2
    w = rand((e, out_f, in_f), 1)
    b = rand((e, out_f), 2)
    for act in [None, 0.1]:
        layer = PerTensorFP8Linear.from_float(w, bias=b, activation_scale=act)
        assert layer.weight_shape == (e, out_f, in_f)
        x = rand((tokens, in_f), 3)
        idx = np.random.default_rng(4).integers(0, e, size=(tokens, k))
        y = layer.gather_forward(x, idx)
        assert y.shape == (tokens, k, out_f)
        wd = decoded(layer)
        for t in range(tokens):
            for j in range(k):
                ex = idx[t, j]
                ref = fp8_linear_forward(x[t : t + 1], wd[ex], layer.weight_scale_inv, act, b[ex])[
                    0
                ]
                np.testing.assert_allclose(y[t, j], ref, rtol=1e-5, atol=1e-5)
        y16 = layer.gather_forward_autocast(x.astype(np.float16), idx)
        assert y16.dtype == np.float16
        with pytest.raises(ValueError, match="out of range"):
            layer.gather_forward(x, np.full((tokens, k), e))
        with pytest.raises(ValueError, match="out of range"):
            layer.gather_forward(x, np.full((tokens, k), -1))
        with pytest.raises(TypeError, match="indices"):
            layer.gather_forward(x, idx.astype(np.float32))
        with pytest.raises(quantrs.DimensionMismatch):
            layer.gather_forward(x, idx[:-1])
        with pytest.raises(quantrs.UnsupportedOperation):
            layer.forward(x)
    flat = PerTensorFP8Linear.from_float(w[0])
    with pytest.raises(NotImplementedError):
        flat.gather_forward(rand((2, in_f), 1), np.zeros((2, 1), np.int64))


def test_track_stats_imatrix():
    layer = PerTensorFP8Linear.from_float(rand((4, 8), 1))
    with pytest.raises(quantrs.InvalidState):
        layer.end_track_stats()
    layer.begin_track_stats()
    with pytest.raises(quantrs.InvalidState):
        layer.end_track_stats()  # no rows seen
    layer.begin_track_stats()
    a, b = rand((3, 8), 2), rand((2, 5, 8), 3)
    layer.forward(a)
    layer.forward(b)
    im = layer.end_track_stats()
    rows = np.concatenate([a, b.reshape(-1, 8)]).astype(np.float64)
    np.testing.assert_allclose(im, (rows**2).mean(axis=0), rtol=1e-6)
    assert im.dtype == np.float32 and im.shape == (8,)
    with pytest.raises(quantrs.InvalidState):
        layer.end_track_stats()


def test_serialize_round_trip_bit_exact():
    for act, bias in [(None, None), (0.25, rand(6, 1))]:
        layer = PerTensorFP8Linear.from_float(rand((6, 10), 2), bias=bias, activation_scale=act)
        blob = layer.serialize()
        assert isinstance(blob, bytes)
        back = PerTensorFP8Linear.deserialize(blob)
        assert back.serialize() == blob
        assert np.array_equal(back.weight, layer.weight)
        assert back.weight_scale_inv == layer.weight_scale_inv
        assert back.activation_scale == layer.activation_scale
        x = rand((3, 10), 3)
        assert np.array_equal(back.forward(x), layer.forward(x))
        p = pickle.loads(pickle.dumps(layer))
        assert p.serialize() == blob
        ext = rand(6, 9)
        blob2 = layer.serialize_with_bias(ext)
        lay2, b2 = PerTensorFP8Linear.deserialize_ext_bias(blob2)
        assert lay2.bias is None and np.array_equal(b2, ext)
        lay3, b3 = PerTensorFP8Linear.deserialize_ext_bias(layer.serialize_with_bias(None))
        assert b3 is None
        assert np.array_equal(PerTensorFP8Linear.deserialize(blob2).bias, ext)
    with pytest.raises(quantrs.DimensionMismatch):
        layer.serialize_with_bias(np.ones(3, np.float32))


def test_serialize_format_layout():
    layer = PerTensorFP8Linear(np.array([[0x38, 0x40]], np.uint8), 0.5)
    blob = layer.serialize()
    version, tag, flags = struct.unpack_from("<IBB", blob, 0)
    assert (version, tag, flags) == (1, 1, 0)
    nbytes, dtype, rank = struct.unpack_from("<QBB", blob, 6)
    assert (nbytes, rank) == (2, 2)
    dims = struct.unpack_from("<QQ", blob, 16)
    assert dims == (1, 2) and blob[32:34] == bytes([0x38, 0x40])
    import zlib

    assert struct.unpack("<I", blob[-4:])[0] == zlib.crc32(blob[:-4])


def _write_st(path, tensors):
    header, offset, chunks = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        chunks.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def test_from_safetensors(tmp_path):
    w = rand((8, 16), 1)
    ref = PerTensorFP8Linear.from_float(w, activation_scale=0.125, bias=rand(8, 2))
    f = tmp_path / "model.safetensors"
    _write_st(
        f,
        {
            "layers.0.q.weight": ("F8_E4M3", (8, 16), ref.weight.tobytes()),
            "layers.0.q.weight_scale_inv": ("F32", (), np.float32(ref.weight_scale_inv).tobytes()),
            "layers.0.q.activation_scale": ("F32", (1,), np.float32(0.125).tobytes()),
            "layers.0.q.bias": ("F32", (8,), ref.bias.tobytes()),
            "layers.0.k.weight": ("F8_E4M3", (8, 16), ref.weight.tobytes()),
            "layers.0.k.weight_scale_inv": ("F32", (), np.float32(2.0).tobytes()),
        },
    )
    layer = PerTensorFP8Linear.from_safetensors(str(f), "layers.0.q")
    assert layer.serialize() == ref.serialize()
    x = rand((2, 16), 3)
    assert np.array_equal(layer.forward(x), ref.forward(x))
    k = PerTensorFP8Linear.from_safetensors(f, "layers.0.k")
    assert k.activation_scale is None and k.bias is None and k.weight_scale_inv == 2.0
    with pytest.raises(quantrs.SerializationError, match="missing"):
        PerTensorFP8Linear.from_safetensors(f, "layers.0.v")
    with pytest.raises(OSError):
        PerTensorFP8Linear.from_safetensors(tmp_path / "nope.safetensors", "x")
    bad = tmp_path / "bad.safetensors"
    _write_st(
        bad,
        {
            "l.weight": ("F8_E4M3", (2, 2), bytes(4)),
            "l.weight_scale_inv": ("F32", (2,), np.ones(2, np.float32).tobytes()),
        },
    )
    with pytest.raises(quantrs.SerializationError, match="scalar"):
        PerTensorFP8Linear.from_safetensors(bad, "l")
    bad.write_bytes(b"garbage")
    with pytest.raises(quantrs.SerializationError):
        PerTensorFP8Linear.from_safetensors(bad, "l")


@pytest.mark.kernel
@settings(max_examples=40)
@given(
    rows=st.integers(0, 9),
    in_f=st.integers(1, 80),
    out_f=st.integers(1, 40),
    act=st.sampled_from([None, 0.5, 1e-3]),
    special=st.sampled_from(["normal", "zeros", "constant", "tiny"]),
    seed=st.integers(0, 2**16),
)
def test_forward_property(rows, in_f, out_f, act, special, seed):
    w = rand((out_f, in_f), seed)
    x = rand((rows, in_f), seed + 1)
    if special == "zeros":
        w[:] = 0
    elif special == "constant":
        w[:] = 0.75
        x[:] = -2.0
    elif special == "tiny":
        w *= np.float32(1e-30)
        x *= np.float32(1e-20)
    layer = PerTensorFP8Linear.from_float(w, bias=np.zeros(out_f), activation_scale=act)
    y = layer.forward(x)
    assert y.shape == (rows, out_f)
    ref = fp8_linear_forward(x, decoded(layer), layer.weight_scale_inv, act)
    wfull = decoded(layer) * layer.weight_scale_inv
    xs = x if act is None else fp8_round(x / np.float32(act), "e4m3", True) * act
    tol = 1e-5 * np.abs(xs.astype(np.float64)) @ np.abs(wfull).T + 1e-30
    assert np.all(np.abs(y - ref) <= tol)
