"""The Python side of ``quantrs.cuda.QatOptimizer`` and ``quantrs.cuda.calibrate`` without
a device. The engine (``_core._CudaQat``) is replaced by a host stand-in that keeps the
state in a CPU ``QatOptimizer`` (NumPy "device" arrays), so the wrapper's plumbing
(``from_cpu`` / ``to`` / ``cpu()``, bytes and pickling, setters, ``set_moments``) is
checked against the CPU optimizer here; the real engine's refusals without a device are
checked too. The device engine itself is checked by test_gpu_qat.py on a GPU and, without
one, by the host build of its kernels (``cargo test --features gpu gpu::qat_host``)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc


class HostEngine:
    """``_core._CudaQat``'s interface over a CPU optimizer."""

    def __init__(self, state: bytes, shape, device: int = 0) -> None:
        self.cpu = quantrs.QatOptimizer.from_bytes(state, shape)
        self.device = f"cuda:{device}"

    def step(self, master, grad, rng=None):
        self.cpu.step(master, grad, rng)

    @property
    def quantized_weights(self):
        return self.cpu.quantized_weights

    def moments(self):
        return self.cpu.moments()

    def quant_params(self):
        return self.cpu.quant_params()

    def step_count(self):
        return self.cpu.step_count()

    @property
    def config(self):
        return self.cpu.config

    @property
    def seed(self):
        return self.cpu.seed

    @property
    def dtype_name(self):
        return self.cpu.dtype

    @property
    def shape(self):
        return self.cpu.shape

    def to_bytes(self):
        return self.cpu.to_bytes()

    def load_bytes(self, b):
        self.cpu = quantrs.QatOptimizer.from_bytes(b, self.cpu.shape)

    def memory_usage(self):
        return 3 * self.cpu.quantized_weights.nbytes

    def set_hyper(self, *h):
        self.cpu.set_hyper(*h)

    def set_rounding(self, r):
        self.cpu.set_rounding(r)

    def set_seed(self, s):
        self.cpu.set_seed(s)

    def __len__(self):
        return len(self.cpu)


@pytest.fixture
def host_engine(monkeypatch):
    monkeypatch.setattr(qc._core, "_CudaQat", HostEngine, raising=False)
    monkeypatch.setattr(qc, "_HAS_GPU_BUILD", True)


def grads(t: int, n: int, dtype) -> np.ndarray:
    return np.random.default_rng(100 + t).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wrapper_round_trips_state_and_steps_as_the_cpu(host_engine, dtype):
    cfg = quantrs.QatConfig("int4", "affine", "stochastic", 2e-2, weight_decay=0.01)
    w0 = np.random.default_rng(1).standard_normal(500).astype(dtype)
    ref_w, dev_w = w0.copy(), w0.copy()
    ref = quantrs.QatOptimizer(ref_w, cfg, rng=7)
    dev = qc.QatOptimizer.from_cpu(quantrs.QatOptimizer(dev_w, cfg, rng=7), "cuda:0")
    assert dev.to_bytes() == ref.to_bytes() and dev.device == "cuda:0"
    for t in range(4):
        g = grads(t, 500, dtype)
        ref.step(ref_w, g)
        dev.step(dev_w, g)
    assert np.array_equal(dev_w, ref_w) and dev.to_bytes() == ref.to_bytes()
    assert dev.step_count() == 4 and dev.dtype == np.dtype(dtype).name
    assert dev.shape == (500,) and len(dev) == 500 and dev.seed == ref.seed
    assert dev.quant_params() == ref.quant_params()
    assert np.array_equal(dev.quantized_weights, ref.quantized_weights)
    back = dev.to("cpu")
    assert isinstance(back, quantrs.QatOptimizer) and back.to_bytes() == ref.to_bytes()
    assert dev.to("cuda") is dev
    assert pickle.loads(pickle.dumps(dev)).to_bytes() == ref.to_bytes()
    assert qc.QatOptimizer.from_bytes(ref.to_bytes(), ref.shape).to_bytes() == ref.to_bytes()
    assert "device='cuda:0'" in repr(dev) and "int4" in repr(dev)


def test_setters_and_restored_moments_go_through_the_cpu_checks(host_engine):
    cfg = quantrs.QatConfig("int8", lr=1e-2)
    w = np.linspace(-1, 1, 64)
    ref = quantrs.QatOptimizer(w.copy(), cfg, rng=3)
    dev = qc.QatOptimizer.from_cpu(quantrs.QatOptimizer(w.copy(), cfg, rng=3))
    for opt in (ref, dev):
        opt.set_lr(0.5)
        opt.set_betas(0.8, 0.95)
        opt.set_eps(1e-6)
        opt.set_weight_decay(0.1)
        opt.set_rounding("stochastic")
        opt.set_seed(99)
        opt.set_moments(3, np.full(64, 0.5), np.full(64, 0.25))
    assert dev.to_bytes() == ref.to_bytes()
    before = dev.to_bytes()
    with pytest.raises(quantrs.InvalidArgument, match="beta1"):
        dev.set_betas(1.5, 0.9)
    with pytest.raises(quantrs.InvalidArgument, match="v"):
        dev.set_moments(4, np.zeros(64), np.full(64, -1.0))
    assert dev.to_bytes() == before


def test_refusals_without_a_device():
    master = np.ones(8, np.float32)
    with pytest.raises(quantrs.InvalidArgument, match="master: expected a CUDA array"):
        qc.QatOptimizer(master, "int8")
    with pytest.raises(TypeError, match="quantrs.QatOptimizer"):
        qc.QatOptimizer.from_cpu(quantrs.AdamW4bit())
    with pytest.raises(quantrs.InvalidArgument, match="device"):
        qc.QatOptimizer.from_cpu(quantrs.QatOptimizer(master, "int8", rng=0), "tpu")
    cpu = quantrs.QatOptimizer(master, "int8", rng=0)
    assert cpu.to("cpu") is cpu
    if not qc.is_available():
        with pytest.raises(quantrs.CudaNotAvailable):
            qc.QatOptimizer.from_cpu(cpu)
        with pytest.raises(quantrs.CudaNotAvailable):
            cpu.to("cuda")
    with pytest.raises(quantrs.InvalidArgument, match="x"):
        qc.calibrate(master)
