"""GPU kernels against the CPU path on the same inputs (``pytest -m gpu``).

Bit-identical where promised (FP8 codecs, pickling / serialize bytes);
elsewhere within f32-accumulation bounds: |gpu - cpu| <= 2e-5 * (|x| @ |W|)
+ 1e-5, the order-of-summation error of two f32 dot products. Skips with the
reason when no CUDA device is usable.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc
from quantrs import fp8

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not qc.is_available(), reason=f"no CUDA: {qc.unavailable_reason()}"),
]

RNG = np.random.default_rng(1234)


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    return torch


def assert_close_dot(got, want, x, w_abs_in_out):
    """`got` ~ `want` within the f32 summation bound of x @ W."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    bound = 2e-5 * (np.abs(x) @ w_abs_in_out) + 1e-5
    err = np.abs(got - want)
    assert np.all(err <= bound.reshape(err.shape)), float((err / bound.reshape(err.shape)).max())


# ---------------------------------------------------------------- arrays


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8])
def test_device_array_round_trip(dtype):
    a = (RNG.standard_normal((3, 5, 7)) * 50).astype(dtype)
    d = qc.DeviceArray.from_numpy(a)
    assert d.shape == (3, 5, 7) and d.dtype == np.dtype(dtype) and d.device == "cuda:0"
    assert d.__dlpack_device__() == (2, 0)
    np.testing.assert_array_equal(d.numpy(), a)
    np.testing.assert_array_equal(np.asarray(d), a)


def test_device_array_refuses_other_dtypes():
    with pytest.raises(TypeError, match="float32, uint8 or int8"):
        qc.DeviceArray.from_numpy(np.ones(3, np.float64))


def test_dlpack_to_and_from_torch_zero_copy():
    torch = _torch()
    a = RNG.standard_normal((4, 6)).astype(np.float32)
    d = qc.DeviceArray.from_numpy(a)
    t = torch.from_dlpack(d)
    assert t.is_cuda and t.data_ptr() == d.data_ptr
    np.testing.assert_array_equal(t.cpu().numpy(), a)
    # torch -> quantrs: a layer reads the tensor in place.
    w = RNG.standard_normal((3, 6)).astype(np.float32)
    layer = quantrs.UnquantLinear(w).to("cuda")
    y = layer(t)
    assert isinstance(y, qc.DeviceArray)
    assert_close_dot(y.numpy(), a @ w.T, a, np.abs(w.T))
    # del the producer: the DeviceArray export keeps its own reference.
    del d
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), a)


def test_dlpack_with_cupy_zero_copy():
    cp = pytest.importorskip("cupy")
    a = RNG.standard_normal((5, 8)).astype(np.float32)
    d = qc.DeviceArray.from_numpy(a)
    c = cp.from_dlpack(d)
    assert c.data.ptr == d.data_ptr
    np.testing.assert_array_equal(cp.asnumpy(c), a)
    codes = qc.encode(cp.asarray(a), "e4m3", True)
    np.testing.assert_array_equal(codes.numpy(), fp8.encode(a, "e4m3", True))


def test_torch_stream_work_is_ordered_before_the_kernel():
    torch = _torch()
    w = RNG.standard_normal((64, 256)).astype(np.float32)
    layer = quantrs.UnquantLinear(w).to("cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.zeros((8, 256), device="cuda")
        for _ in range(20):  # queued on a side stream, not yet done
            x = x + 0.5
        y = layer(x)  # DLPack with stream=1: torch orders s before us
    want = np.full((8, 256), 10.0, np.float32) @ w.T
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-3)


# ---------------------------------------------------------------- FP8


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_decode_every_code_bit_identical(fmt):
    codes = np.arange(256, dtype=np.uint8)
    got = qc.decode(qc.DeviceArray.from_numpy(codes), fmt).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), fp8.decode(codes, fmt).view(np.uint32))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("saturate", [False, True])
def test_fp8_encode_bit_identical(fmt, saturate):
    bits = RNG.integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate(
        [
            bits.view(np.float32),
            (RNG.standard_normal(1 << 16) * 300).astype(np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 449, 464, 57344, 1e-9], np.float32),
        ]
    )
    got = qc.encode(qc.DeviceArray.from_numpy(x), fmt, saturate).numpy()
    np.testing.assert_array_equal(got, fp8.encode(x, fmt, saturate))
    # quantrs.fp8 dispatches CUDA inputs to the device codec.
    d = fp8.encode(qc.DeviceArray.from_numpy(x), fmt, saturate)
    assert isinstance(d, qc.DeviceArray)
    np.testing.assert_array_equal(d.numpy(), got)


# ---------------------------------------------------------------- INT4


@pytest.mark.parametrize(
    "in_feat,out_feat,group",
    [(256, 512, 32), (130, 77, 32), (1000, 260, 64), (4096, 1024, 128), (7, 5, 2)],
)
@pytest.mark.parametrize("batch", [1, 3, 8, 9, 16, 70])
def test_int4_matmul_matches_cpu(in_feat, out_feat, group, batch):
    w = RNG.standard_normal((in_feat, out_feat)).astype(np.float32)
    q = quantrs.QuantizedWeight.quantize(w, group_size=group, method="rtn")
    g = q.to("cuda")
    assert type(g) is quantrs.QuantizedWeight and g.device == "cuda:0" and q.device == "cpu"
    x = RNG.standard_normal((batch, in_feat)).astype(np.float32)
    want = q.matmul(x)
    wabs = np.abs(q.dequantize())
    assert_close_dot(g.matmul(x), want, x, wabs)
    if batch == 1:
        assert_close_dot(g.matvec(x[0]), q.matvec(x[0]), x, wabs)


def test_int4_device_input_gives_device_output_and_repeat_calls_agree():
    w = RNG.standard_normal((512, 300)).astype(np.float32)
    g = quantrs.QuantizedWeight.quantize(w, method="rtn").to("cuda")
    x = qc.DeviceArray.from_numpy(RNG.standard_normal((2, 512)).astype(np.float32))
    y1 = g.matmul(x)
    assert isinstance(y1, qc.DeviceArray) and y1.shape == (2, 300)
    for _ in range(3):  # the split-K counters are reset by every call
        np.testing.assert_array_equal(g.matmul(x).numpy(), y1.numpy())


def _safetensors_parts(b: bytes):
    """(header as a dict, tensor bytes): equal for equal files even where the
    writer orders the metadata keys differently from call to call."""
    n = int.from_bytes(b[:8], "little")
    return json.loads(b[8 : 8 + n]), b[8 + n :]


def test_quantized_weight_to_and_back_and_pickle_bytes():
    q = quantrs.QuantizedWeight.quantize(
        RNG.standard_normal((96, 40)).astype(np.float32), method="rtn"
    )
    g = q.to("cuda:0")
    assert g.to("cuda") is g
    back = g.to("cpu")
    assert isinstance(back, quantrs.QuantizedWeight) and back == q
    assert _safetensors_parts(g.to_bytes()) == _safetensors_parts(q.to_bytes())
    assert quantrs.QuantizedWeight.from_bytes(g.to_bytes()) == q
    assert pickle.loads(pickle.dumps(g)) == q
    assert (g.in_feat, g.out_feat, g.num_groups, g.group_size, g.nbytes) == (
        q.in_feat,
        q.out_feat,
        q.num_groups,
        q.group_size,
        q.nbytes,
    )


# ---------------------------------------------------------------- layers


def _layers(out_f=96, in_f=200):
    w = RNG.standard_normal((out_f, in_f)).astype(np.float32)
    b = RNG.standard_normal(out_f).astype(np.float32)
    return [
        quantrs.UnquantLinear(w, b),
        quantrs.Int8Linear.from_float(w, b),
        quantrs.Int4Linear.from_float(w, b, 32),
        quantrs.PerTensorFP8Linear.from_float(w, b),
        quantrs.PerTensorFP8Linear.from_float(w, b, activation_scale=0.02),
    ]


@pytest.mark.parametrize("rows", [1, 4, 8, 16, 33, 128])
def test_every_layer_forward_matches_cpu(rows):
    for layer in _layers():
        g = layer.to("cuda")
        assert type(g) is type(layer) and g.device == "cuda:0" and layer.device == "cpu"
        dt, dev = layer.dtype_and_device()
        assert g.dtype_and_device() == (dt, "cuda:0")
        assert g.quantized_act_type() == layer.quantized_act_type()
        x = RNG.standard_normal((rows, layer.in_features)).astype(np.float32)
        w_abs = np.abs(layer.dequantize_w()).T
        if layer.quantized_act_type() is not None:  # W8A8: compare on the grid
            x_grid = fp8.decode(fp8.encode(x / 0.02, "e4m3", True)) * 0.02
            bound_x = x_grid
        else:
            bound_x = x
        assert_close_dot(g.forward(x), layer.forward(x), bound_x, w_abs)


@pytest.mark.parametrize("rows", [16, 64, 256])
def test_fp8_w8a8_tensor_core_path_matches_cpu(rows):
    """Shapes cuBLASLt takes (multiples of 16): on sm_89+ the E4M3 GEMM runs,
    within its accumulation contract (1e-3 of sum |xq w|), bias exact."""
    w = RNG.standard_normal((256, 512)).astype(np.float32)
    b = RNG.standard_normal(256).astype(np.float32)
    layer = quantrs.PerTensorFP8Linear.from_float(w, b, activation_scale=0.02)
    g = layer.to("cuda")
    x = RNG.standard_normal((rows, 512)).astype(np.float32)
    got, want = g(x), layer(x)
    x_grid = fp8.decode(fp8.encode(x / 0.02, "e4m3", True)) * 0.02
    bound = 1e-3 * (np.abs(x_grid) @ np.abs(layer.dequantize_w()).T) + 1e-5
    assert np.all(np.abs(got - want) <= bound)
    path = qc.device_info(0)["fp8_gemm"]
    if qc.device_info(0)["compute_capability"] >= (8, 9):
        assert path == "cublaslt", path


def test_forward_keeps_leading_dimensions():
    layer = _layers()[0]
    x = RNG.standard_normal((2, 3, layer.in_features)).astype(np.float32)
    g = layer.to("cuda")
    y = g(x)
    assert y.shape == (2, 3, layer.out_features)
    assert_close_dot(y, layer(x), x, np.abs(layer.dequantize_w()).T)


@pytest.mark.parametrize("target", [None, "int8", "int4", "fp8_e4m3"])
def test_apply_isq_on_cuda(target):
    w = RNG.standard_normal((64, 128)).astype(np.float32)
    base = quantrs.UnquantLinear(w)
    cpu = base.apply_isq(target, "cpu")
    gpu = base.apply_isq(target, "cuda")
    assert gpu.dtype_and_device() == (cpu.dtype_and_device()[0], "cuda:0")
    assert gpu.serialize() == cpu.serialize()
    x = RNG.standard_normal((5, 128)).astype(np.float32)
    assert_close_dot(gpu(x), cpu(x), x, np.abs(cpu.dequantize_w()).T)


def test_layer_serialize_and_pickle_are_the_cpu_bytes():
    for layer in _layers():
        g = layer.to("cuda")
        assert g.serialize() == layer.serialize()
        assert pickle.dumps(g) == pickle.dumps(layer)
        back = g.to("cpu")
        assert type(back) is type(layer) and back.serialize() == layer.serialize()
        assert back.device == "cpu" and g.to("cuda:0") is g


def test_host_only_methods_name_the_device():
    g = _layers()[0].to("cuda")
    x = np.ones((2, g.in_features), np.float32)
    for call in (
        lambda: g.forward_autocast(x),
        lambda: g.gather_forward(x, np.zeros((2, 1), np.int64)),
        lambda: g.begin_track_stats(),
    ):
        with pytest.raises(quantrs.UnsupportedOperation, match="cuda:0"):
            call()
    q = quantrs.QuantizedWeight.quantize(np.ones((64, 8), np.float32), method="rtn").to("cuda")
    with pytest.raises(quantrs.UnsupportedOperation, match="cuda:0"):
        q.matvec(np.ones(64, np.float32), activations="int8")


# ---------------------------------------------------------------- errors


def test_bad_inputs_raise_and_change_nothing():
    torch = _torch()
    layer = _layers()[0]
    g = layer.to("cuda")
    x = RNG.standard_normal((4, layer.in_features)).astype(np.float32)
    before = g.forward(x)
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        g.forward(np.ones((4, layer.in_features + 1), np.float32))
    with pytest.raises(TypeError, match="float32"):
        g.forward(torch.ones((4, layer.in_features), dtype=torch.float64, device="cuda"))
    with pytest.raises(ValueError, match="contiguous"):
        g.forward(torch.ones((layer.in_features, 4), device="cuda").T)
    with pytest.raises(TypeError, match="float32"):
        g.forward(qc.DeviceArray.from_numpy(np.ones((4, layer.in_features), np.uint8)))
    np.testing.assert_array_equal(g.forward(x), before)


def test_missing_device_is_cuda_not_available():
    n = qc.device_count()
    with pytest.raises(quantrs.CudaNotAvailable, match=f"cuda:{n + 7}"):
        _layers()[0].to(f"cuda:{n + 7}")


def test_device_mismatch_names_both_devices():
    torch = _torch()
    if torch.cuda.device_count() < 2 or qc.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    g = _layers()[0].to("cuda:0")
    x = torch.ones((1, g.in_features), device="cuda:1")
    with pytest.raises(quantrs.InvalidArgument, match="cuda:1.*cuda:0"):
        g(x)


def test_device_info():
    info = qc.device_info(0)
    assert info["compute_capability"] >= (7, 0)
    assert info["total_memory"] >= info["free_memory"] > 0
    assert info["nvrtc_version"][0] >= 12
