"""One class per concept without a device: ``AdamW4bit`` / ``Adam4bit`` /
``QatOptimizer`` report their device, ``.to("cpu")`` returns the object itself,
a move that cannot happen raises and leaves the object as it was on the host, and
``quantrs.cuda`` holds only what is device-specific. The device side of the same
classes is checked by test_gpu_optim.py and test_gpu_qat.py on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc

no_device = pytest.mark.skipif(qc.is_available(), reason="a CUDA device is available")


def trained(cls):
    opt = cls(1e-2, 0.9, 0.99, 1e-8, 0.01)
    w = np.linspace(-1, 1, 300, dtype=np.float32)
    for t in range(3):
        opt.update(w, np.full(300, 0.1 * (t + 1), np.float32), name="p")
        opt.step()
    return opt, w


@pytest.mark.parametrize("cls", [quantrs.AdamW4bit, quantrs.Adam4bit])
def test_optimizer_device_and_to_cpu(cls):
    opt, _ = trained(cls)
    assert opt.device == "cpu"
    assert opt.to("cpu") is opt
    assert repr(opt).startswith(f"{cls.__name__}(")
    with pytest.raises(quantrs.InvalidArgument, match="device"):
        opt.to("tpu")


@no_device
@pytest.mark.parametrize("cls", [quantrs.AdamW4bit, quantrs.Adam4bit])
def test_optimizer_failed_move_keeps_the_host_state(cls):
    opt, w = trained(cls)
    before = opt.__getstate__()
    with pytest.raises(quantrs.CudaNotAvailable):
        opt.to("cuda")
    assert opt.device == "cpu" and opt.__getstate__() == before
    opt.update(w, np.ones(300, np.float32), name="p")  # still a working CPU optimizer


def test_optimizer_with_accumulated_gradients_does_not_move():
    opt, w = trained(quantrs.AdamW4bit)
    opt.accumulate_grad(w, np.ones(300, np.float32), name="p")
    with pytest.raises(quantrs.InvalidState, match="accumulated"):
        opt.to("cuda")
    assert opt.device == "cpu"
    opt.zero_grad()
    assert opt.to("cpu") is opt


def test_qat_optimizer_device_and_to_cpu():
    master = np.linspace(-1, 1, 64, dtype=np.float32)
    opt = quantrs.QatOptimizer(master, "int8", rng=0)
    assert opt.device == "cpu" and opt.to("cpu") is opt
    assert opt.memory_usage() == 3 * 4 * 64
    assert "to(" not in repr(opt)
    with pytest.raises(quantrs.InvalidArgument, match="device"):
        opt.to("cuda:x")


@no_device
def test_qat_optimizer_failed_move_keeps_the_host_state():
    master = np.linspace(-1, 1, 64)
    opt = quantrs.QatOptimizer(master, "int4", rng=3)
    opt.step(master, np.full(64, 0.5))
    before = opt.to_bytes()
    with pytest.raises(quantrs.CudaNotAvailable):
        opt.to("cuda")
    assert opt.device == "cpu" and opt.to_bytes() == before


def test_cuda_module_holds_only_device_specific_names():
    for gone in ("AdamW4bit", "Adam4bit", "QatOptimizer", "MemoryUsage"):
        assert not hasattr(qc, gone)
    for name in qc.__all__:
        assert hasattr(qc, name)
    master = np.ones(8, np.float32)
    with pytest.raises(quantrs.InvalidArgument, match="x"):
        qc.calibrate(master)


def test_weight_and_layers_report_the_host_and_to_cpu_is_the_object():
    q = quantrs.QuantizedWeight.quantize(np.ones((16, 4), np.float32), group_size=8, method="rtn")
    assert q.device == "cpu" and q.to("cpu") is q and "device" not in repr(q)
    for layer in (
        quantrs.UnquantLinear(np.ones((4, 8), np.float32)),
        quantrs.Int8Linear.from_float(np.ones((4, 8), np.float32)),
        quantrs.Int4Linear.from_float(np.ones((4, 32), np.float32)),
        quantrs.PerTensorFP8Linear.from_float(np.ones((4, 8), np.float32)),
    ):
        assert layer.device == "cpu" and layer.to("cpu") is layer
        assert layer.dtype_and_device()[1] == "cpu"
