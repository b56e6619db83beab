"""The GPU surface on machines without a usable device (CI): every entry
point raises CudaNotAvailable with the reason, nothing panics, and the NVRTC
from the test venv compiles every kernel (no device needed)."""

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc

no_device = pytest.mark.skipif(qc.is_available(), reason="a CUDA device is available")


def test_build_includes_the_gpu_feature():
    assert "gpu" in quantrs.build_info()["features"]
    assert quantrs.build_info()["cuda_available"] == qc.is_available()


@no_device
def test_cuda_unavailable_is_reported_not_raised():
    assert quantrs.cuda_available() is False
    reason = qc.unavailable_reason()
    assert isinstance(reason, str) and reason


@no_device
def test_device_entry_points_raise_cuda_not_available():
    w = quantrs.QuantizedWeight.quantize(np.ones((8, 4), np.float32), group_size=8, method="rtn")
    for call in (
        lambda: w.to("cuda"),
        lambda: quantrs.UnquantLinear(np.ones((4, 8), np.float32)).to("cuda:0"),
        lambda: quantrs.Int8Linear.from_float(np.ones((4, 8), np.float32)).apply_isq(
            "int4", device="cuda"
        ),
        lambda: qc.DeviceArray.from_numpy(np.ones(3, np.float32)),
        lambda: qc.device_info(0),
        lambda: quantrs.AdamW4bit(1e-3).to("cuda"),
        lambda: quantrs.Adam4bit().to("cuda:0"),
        lambda: quantrs.QatOptimizer(np.ones(4, np.float32), "int8", rng=0).to("cuda"),
    ):
        with pytest.raises(quantrs.CudaNotAvailable):
            call()


def test_to_cpu_returns_the_object_and_bad_devices_are_refused():
    w = quantrs.QuantizedWeight.quantize(np.ones((8, 4), np.float32), group_size=8, method="rtn")
    assert w.to("cpu") is w
    layer = quantrs.UnquantLinear(np.ones((4, 8), np.float32))
    assert layer.to("cpu") is layer
    opt = quantrs.AdamW4bit()
    assert opt.to("cpu") is opt
    for bad in ("tpu", "cuda:x", ""):
        with pytest.raises(quantrs.InvalidArgument, match="device"):
            layer.to(bad)


def test_nvrtc_compiles_every_kernel_without_a_device():
    pytest.importorskip("nvidia", reason="nvidia-cuda-nvrtc is not installed")
    for arch in ("sm_80", "sm_90"):
        sizes = quantrs._core._cuda_compile_all(arch)
        assert set(sizes) == {"int4", "fp8", "linear", "optim", "qat"}
        assert all(n > 1000 for n in sizes.values()), sizes
