"""The Python side of ``quantrs.cuda.AdamW4bit`` / ``Adam4bit`` without a device: the
engine (``_core._CudaAdam``) is replaced by a host stand-in that keeps the state in a CPU
optimizer, so the wrapper's plumbing (construction, ``from_cpu`` / ``to``, state dicts,
files, pickling, memory figures) is checked against the CPU optimizer here; the device
engine itself is checked by test_gpu_optim.py on a GPU."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc


class HostEngine:
    """``_core._CudaAdam``'s interface over a CPU optimizer (NumPy "device" arrays)."""

    def __init__(self, state: bytes, kind: str, device: int = 0) -> None:
        self.cpu = getattr(quantrs, kind)()
        self.cpu.__setstate__(state)
        self.kind, self.device = kind, f"cuda:{device}"

    def update(self, param, grad, *, name=None):
        self.cpu.update(param, grad, name=name)

    def step(self):
        self.cpu.step()

    def get_lr(self):
        return self.cpu.get_lr()

    def set_lr(self, lr):
        self.cpu.set_lr(lr)

    def to_bytes(self):
        return self.cpu.__getstate__()

    def load_bytes(self, b):
        self.cpu.__setstate__(b)

    def memory_usage(self):
        m = self.cpu.memory_usage()
        return (m.momentum_elements, m.variance_elements, 0, m.total_bytes, m.num_parameters)

    def num_parameters(self):
        return self.cpu.num_parameters()


@pytest.fixture
def host_engine(monkeypatch):
    monkeypatch.setattr(qc._core, "_CudaAdam", HostEngine, raising=False)
    monkeypatch.setattr(qc, "_HAS_GPU_BUILD", True)


def train(opt, w, steps, start=0):
    for t in range(start, start + steps):
        g = np.random.default_rng(t).standard_normal(w.shape).astype(np.float32)
        opt.update(w, g, name="p")
        opt.step()


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(np.array_equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("cls", [qc.AdamW4bit, qc.Adam4bit])
def test_wrapper_round_trips_configuration_and_state(host_engine, cls, tmp_path):
    q = quantrs.AdvancedQuantizationConfig("int8", 32, variance_map="log")
    o = quantrs.Adam4bitOptimizerConfig(2e-2, 0.8, 0.99, 1e-7, 0.05)
    dev = cls.with_quantization_config(o, q, device="cuda:0")
    ref = cls._cpu_cls.with_quantization_config(o, q)
    w, wr = np.ones(3000, np.float32), np.ones(3000, np.float32)
    train(dev, w, 5)
    train(ref, wr, 5)
    assert np.array_equal(w, wr) and same_state(dev, ref)
    assert dev.config_dict() == ref.config_dict() and dev.state().step == 5
    assert dev.memory_usage().total_bytes == ref.memory_usage().total_bytes
    assert dev.memory_savings() == pytest.approx(ref.memory_savings())
    back = dev.to("cpu")
    assert isinstance(back, cls._cpu_cls) and same_state(back, ref)
    assert dev.to("cuda") is dev
    moved = cls.from_cpu(ref, 0)
    assert same_state(moved, ref)
    dev.save_state(tmp_path / "s.safetensors")
    other = cls(device="cuda")
    other.load_state(tmp_path / "s.safetensors")
    assert same_state(other, ref)
    fresh = cls(device=0)
    fresh.load_state_dict(ref.state_dict())
    assert same_state(fresh, ref)
    assert same_state(pickle.loads(pickle.dumps(dev)), ref)
    dev.set_lr(0.5)
    assert dev.lr == pytest.approx(0.5)
    dev.lr = 0.25
    assert dev.get_lr() == pytest.approx(0.25)
    via_to = ref.to("cuda:0")
    assert isinstance(via_to, cls) and via_to.device == "cuda:0" and same_state(via_to, ref)
    assert ref.to("cpu") is ref
    assert "device='cuda:0'" in repr(dev)


def test_wrapper_refuses_bad_arguments(host_engine):
    with pytest.raises(TypeError, match="quantrs.AdamW4bit"):
        qc.AdamW4bit.from_cpu(quantrs.Adam4bit())
    with pytest.raises(quantrs.InvalidArgument, match="device"):
        qc.AdamW4bit(device="tpu")
    opt = qc.AdamW4bit()
    with pytest.raises((quantrs.QuantError, ValueError, KeyError)):
        opt.load_state_dict({"nonsense": np.zeros(3, np.uint8)})
