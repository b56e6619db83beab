"""The 4-bit optimizers on a GPU against the CPU optimizers (``pytest -m gpu``).

Bit-identical: the same weights and the same state (codes, scales, group pairs) after
every step, for every method, variance map, scale format, rank-1 setting, AdamW and
Adam; checkpoints move CPU -> GPU -> CPU mid-training and training continues
identically; bad inputs raise and change nothing. Skipped with the reason where no CUDA
device is usable.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not qc.is_available(), reason=f"needs a CUDA device ({qc.unavailable_reason()})"
    ),
]

METHODS = ["nf4", "int4", "dynamic", "int8"]
MAPS = ["linear", "sqrt_linear", "log", "sqrt_log"]


def grads(step: int, n: int) -> np.ndarray:
    """Gradients whose size changes from block to block, with exact zeros."""
    rng = np.random.default_rng(1000 + step)
    g = rng.standard_normal(n).astype(np.float32)
    g *= (10.0 ** ((np.arange(n) // 64) % 7 - 4)).astype(np.float32)
    g[5::37] = 0.0
    return g


def pair(cls, method="nf4", vmap="sqrt_log", block=64, dq=True, rank1=False, wd=0.1):
    o = quantrs.Adam4bitOptimizerConfig(1e-2, 0.9, 0.99, 1e-8, wd)
    q = quantrs.AdvancedQuantizationConfig(
        method, block, double_quantization=dq, rank1_normalization=rank1, variance_map=vmap
    )
    cpu = cls.with_quantization_config(o, q)
    return cpu, cls.with_quantization_config(o, q).to("cuda")


def assert_same_state(cpu, dev):
    a, b = cpu.state_dict(), dev.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def train(cpu, dev, shape, steps, start=0):
    n = int(np.prod(shape))
    w = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    wd = qc.DeviceArray.from_numpy(w)
    for t in range(start, start + steps):
        g = grads(t, n).reshape(shape)
        cpu.update(w, g, name="p")
        cpu.step()
        dev.update(wd, qc.DeviceArray.from_numpy(g), name="p")
        dev.step()
    return w, wd


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("vmap", MAPS)
@pytest.mark.parametrize("cls", [quantrs.AdamW4bit, quantrs.Adam4bit])
def test_bit_identical_to_the_cpu_over_50_steps(method, vmap, cls):
    cpu, dev = pair(cls, method, vmap)
    w, wd = train(cpu, dev, (40_001,), 50)  # three groups, an odd tail
    assert np.array_equal(w, wd.numpy())
    assert_same_state(cpu, dev)


@pytest.mark.parametrize(
    "dq,rank1,block", [(False, False, 64), (True, True, 128), (False, True, 32)]
)
@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_f32_scales_and_rank1_bit_identical(dq, rank1, block, method):
    cpu, dev = pair(quantrs.AdamW4bit, method, "sqrt_log", block, dq, rank1)
    w, wd = train(cpu, dev, (129, 301), 50)
    assert np.array_equal(w, wd.numpy())
    assert_same_state(cpu, dev)


def test_checkpoint_cpu_to_gpu_to_cpu_mid_training(tmp_path):
    ref, _ = pair(quantrs.AdamW4bit)
    cpu, _ = pair(quantrs.AdamW4bit)
    shape = (20_000,)
    n = shape[0]
    w_ref = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    w = w_ref.copy()
    for t in range(30):
        ref.update(w_ref, grads(t, n), name="p")
        ref.step()
    for t in range(10):
        cpu.update(w, grads(t, n), name="p")
        cpu.step()
    dev = cpu.to("cuda:0")
    assert dev is cpu and dev.device == "cuda:0"
    wd = qc.DeviceArray.from_numpy(w)
    for t in range(10, 20):
        dev.update(wd, qc.DeviceArray.from_numpy(grads(t, n)), name="p")
        dev.step()
    dev.save_state(tmp_path / "mid.safetensors")
    back = quantrs.AdamW4bit()
    back.load_state(tmp_path / "mid.safetensors")
    assert back.state().step == 20
    w = wd.numpy()
    for t in range(20, 30):
        back.update(w, grads(t, n), name="p")
        back.step()
    assert np.array_equal(w, w_ref)
    assert_same_state(ref, back)
    # The device's bytes are the CPU's: pickled, saved and in memory_usage.
    host = pickle.loads(pickle.dumps(dev))
    assert host.device == "cpu"
    assert dev.memory_usage().total_bytes == host.memory_usage().total_bytes


def test_load_state_dict_puts_the_state_back_on_the_device():
    cpu, dev = pair(quantrs.AdamW4bit)
    w, wd = train(cpu, dev, (5000,), 5)
    other = quantrs.AdamW4bit().to("cuda")
    other.load_state_dict(dev.state_dict())
    assert other.device == "cuda:0" and other.num_parameters() == 5000
    assert_same_state(cpu, other)


def test_gradient_accumulation_on_the_device():
    cpu, dev = pair(quantrs.Adam4bit)
    n = 3000
    w = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    wd = qc.DeviceArray.from_numpy(w)
    for t in range(3):
        for k in range(4):
            g = grads(10 * t + k, n)
            cpu.accumulate_grad(w, g, name="p")
            dev.accumulate_grad(wd, qc.DeviceArray.from_numpy(g), name="p")
        cpu.apply_accumulated_grads(4)
        dev.apply_accumulated_grads(4)
        cpu.step()
        dev.step()
    assert np.array_equal(w, wd.numpy())
    assert_same_state(cpu, dev)


def test_bad_inputs_change_nothing():
    torch = pytest.importorskip("torch")
    cpu, dev = pair(quantrs.AdamW4bit)
    w, wd = train(cpu, dev, (4096,), 3)
    before_w, before = wd.numpy(), dev.state_dict()
    g = qc.DeviceArray.from_numpy(grads(9, 4096))
    tw = torch.from_dlpack(wd)
    bad = [
        (quantrs.InvalidArgument, lambda: dev.update(wd, grads(9, 4096), name="p")),  # host grad
        (quantrs.InvalidArgument, lambda: dev.update(before_w, g, name="p")),  # host param
        (TypeError, lambda: dev.update(wd, torch.zeros(4096, dtype=torch.float64, device="cuda"))),
        (ValueError, lambda: dev.update(tw, torch.zeros(8192, device="cuda")[::2], name="p")),
        (quantrs.DimensionMismatch, lambda: dev.update(wd, torch.zeros(4095, device="cuda"))),
        (
            quantrs.InvalidArgument,  # a NaN, found on the device before anything changes
            lambda: dev.update(wd, torch.full((4096,), float("nan"), device="cuda"), name="p"),
        ),
        (quantrs.InvalidArgument, lambda: dev.update(tw, tw, name="p")),  # aliasing
    ]
    for exc, call in bad:
        with pytest.raises(exc):
            call()
        assert np.array_equal(wd.numpy(), before_w)
        after = dev.state_dict()
        assert all(np.array_equal(np.asarray(before[k]), np.asarray(after[k])) for k in before)


def test_torch_cuda_tensors_zero_copy_match_the_cpu():
    torch = pytest.importorskip("torch")
    cpu, dev = pair(quantrs.AdamW4bit, "nf4", "sqrt_log")
    w = torch.randn(3, 4000, generator=torch.Generator().manual_seed(0))
    p = w.cuda()
    wn = w.numpy().copy()
    for t in range(20):
        g = grads(t, 12000).reshape(3, 4000)
        cpu.update(wn, g, name="p")
        cpu.step()
        dev.update(p, torch.from_numpy(g).cuda(), name="p")
        dev.step()
    assert np.array_equal(p.cpu().numpy(), wn)


def test_torch_adapter_engine_on_cuda_within_the_4bit_bound_of_torch_adamw():
    torch = pytest.importorskip("torch")
    from quantrs.torch import _cuda

    # One-element tensors: each block holds one value, so m and v are stored exactly
    # up to the code book's endpoints and the step matches float32 AdamW closely.
    ps = [torch.tensor([0.5 * (k + 1)], device="cuda") for k in range(4)]
    qs = [p.clone() for p in ps]
    engines = [
        _cuda.new_engine(
            quantrs.AdamW4bit,
            quantrs.Adam4bitOptimizerConfig(1e-2, 0.9, 0.999, 1e-8, 0.1),
            quantrs.AdvancedQuantizationConfig(),
            p,
        )
        for p in ps
    ]
    ref = torch.optim.AdamW([torch.nn.Parameter(q) for q in qs], lr=1e-2, weight_decay=0.1)
    for t in range(40):
        gs = [
            torch.tensor([np.sin(0.7 * t + 1.3 * k) * 10 ** (k % 3 - 1)], device="cuda")
            for k in range(4)
        ]
        for e, p, g in zip(engines, ps, gs):
            e.update(_cuda.view(p), _cuda.view(g.float()), name="w")
            e.step()
        for q, g in zip(ref.param_groups[0]["params"], gs):
            q.grad = g.float()
        ref.step()
    for p, q in zip(ps, ref.param_groups[0]["params"]):
        torch.testing.assert_close(p, q.detach(), rtol=2e-5, atol=1e-7)


def test_torch_optimizer_on_cuda_parameters_equals_the_cpu_run():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    w0 = torch.randn(64, 33, generator=torch.Generator().manual_seed(2))
    a = torch.nn.Parameter(w0.clone())
    b = torch.nn.Parameter(w0.clone().cuda())
    oa, ob = qt.AdamW4bit([a], lr=1e-2), qt.AdamW4bit([b], lr=1e-2)
    for t in range(10):
        g = torch.from_numpy(grads(t, a.numel()).reshape(a.shape))
        a.grad, b.grad = g.clone(), g.cuda()
        oa.step()
        ob.step()
    assert torch.equal(a.detach(), b.detach().cpu())
    sa, sb = oa.state_dict()["state"][0], ob.state_dict()["state"][0]
    assert all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def test_to_moves_in_place_and_configuration_reads_stay_on_the_host():
    cpu, dev = pair(quantrs.AdamW4bit)
    w, wd = train(cpu, dev, (3000,), 3)
    assert dev.device == "cuda:0" and dev.config_dict() == cpu.config_dict()
    assert repr(dev) == repr(cpu) + ".to('cuda:0')"
    for opt in (cpu, dev):
        opt.set_hyper(2e-2, 0.8, 0.95, 1e-7, 0.0)
    assert dev.get_lr() == cpu.get_lr() and dev.config_dict() == cpu.config_dict()
    assert dev.to("cpu") is dev and dev.device == "cpu"
    assert_same_state(cpu, dev)
