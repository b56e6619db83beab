"""``quantrs.QatOptimizer`` moved to a GPU against the same class on the CPU (``pytest -m
gpu``).

Bit-identical: the same master, moments, view, parameters and bytes after every step, for
every target, scheme, rounding and master dtype; a failed step fails as on the CPU and
changes nothing; a state moves CPU -> GPU -> CPU mid-training and training continues
identically; ``quantrs.cuda.calibrate`` gives the CPU's parameters; ``QatAdamW`` on CUDA
parameters trains exactly as on CPU ones. Skipped with the reason where no CUDA device is
usable.
"""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
import quantrs.cuda as qc
from quantrs import qat

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not qc.is_available(), reason=f"needs a CUDA device ({qc.unavailable_reason()})"
    ),
]

CONFIGS = [
    (target, scheme, rounding)
    for target in ("int8", "int4", "fp8_e4m3", "fp8_e5m2")
    for scheme in ("symmetric", "affine")
    for rounding in ("nearest", "stochastic")
    if not (target.startswith("fp8") and scheme == "affine")
]


def grads(t: int, n: int, dtype) -> np.ndarray:
    """Gradients whose size changes along the tensor, with exact zeros."""
    g = np.random.default_rng(1000 + t).standard_normal(n)
    g *= 10.0 ** ((np.arange(n) // 97) % 5 - 2)
    g[7::31] = 0.0
    return g.astype(dtype)


def assert_same(cpu, dev, w, wd):
    assert np.array_equal(w, wd.numpy())
    assert np.array_equal(cpu.quantized_weights, dev.quantized_weights.numpy())
    for a, b in zip(cpu.moments(), dev.moments()):
        assert np.array_equal(a, b.numpy())
    assert cpu.quant_params() == dev.quant_params()
    assert cpu.step_count() == dev.step_count()
    assert cpu.to_bytes() == dev.to_bytes()


@pytest.mark.parametrize("target,scheme,rounding", CONFIGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bit_identical_to_the_cpu_over_20_steps(target, scheme, rounding, dtype):
    n = 40_001  # several blocks and CPU chunks, an odd tail
    cfg = quantrs.QatConfig(target, scheme, rounding, 3e-2, 0.9, 0.99, 1e-8, 0.05)
    w = np.random.default_rng(1).standard_normal(n).astype(dtype)
    wd = qc.DeviceArray.from_numpy(w)
    cpu = quantrs.QatOptimizer(w, cfg, rng=11)
    dev = quantrs.QatOptimizer(w.copy(), cfg, rng=11).to("cuda")
    assert dev.device == "cuda:0"
    assert_same(cpu, dev, w, wd)
    for t in range(20):
        g = grads(t, n, dtype)
        seed = 500 + t if t % 3 == 0 else None
        cpu.step(w, g, seed)
        dev.step(wd, qc.DeviceArray.from_numpy(g), seed)
    assert_same(cpu, dev, w, wd)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_failed_steps_change_nothing_and_fail_as_on_the_cpu(dtype):
    n = 3000
    w = np.random.default_rng(2).standard_normal(n).astype(dtype)
    wd = qc.DeviceArray.from_numpy(w)
    cpu = quantrs.QatOptimizer(w, "int8", rng=5)
    dev = quantrs.QatOptimizer(w.copy(), "int8", rng=5).to("cuda")
    bad = grads(0, n, dtype)
    bad[2345] = np.nan
    huge = grads(1, n, dtype)
    huge[99] = 1e30 if dtype == np.float32 else 1e300
    for g in (bad, huge):
        before, w_before = dev.to_bytes(), wd.numpy()
        with pytest.raises(quantrs.QuantError) as want:
            cpu.step(w, g)
        with pytest.raises(type(want.value)) as got:
            dev.step(wd, qc.DeviceArray.from_numpy(g))
        assert str(got.value) == str(want.value)
        assert dev.to_bytes() == before and np.array_equal(wd.numpy(), w_before)
    # Degenerate calibration: lr * weight_decay = 1 and a zero gradient zero the master.
    cfg = quantrs.QatConfig("int4", lr=1.0, weight_decay=1.0)
    dev = quantrs.QatOptimizer(wd.numpy(), cfg, rng=1).to("cuda")
    before = dev.to_bytes()
    with pytest.raises(quantrs.InvalidState, match="degenerate calibration"):
        dev.step(wd, qc.DeviceArray.from_numpy(np.zeros(n, dtype)))
    assert dev.to_bytes() == before and np.array_equal(wd.numpy(), w_before)
    with pytest.raises(quantrs.InvalidArgument, match="grad"):
        dev.step(wd, wd)
    with pytest.raises(quantrs.InvalidArgument, match="master is on the host"):
        dev.step(w, qc.DeviceArray.from_numpy(np.zeros(n, dtype)))
    other = np.float64 if dtype == np.float32 else np.float32
    with pytest.raises((quantrs.QuantError, TypeError, ValueError), match="dtype"):
        dev.step(wd, qc.DeviceArray.from_numpy(np.zeros(n, other)))
    assert dev.to_bytes() == before


def test_moves_between_cpu_and_gpu_mid_training():
    n = 5000
    cfg = quantrs.QatConfig("int4", "affine", "stochastic", 1e-2)
    w = np.random.default_rng(3).standard_normal(n)
    ref_w = w.copy()
    ref = quantrs.QatOptimizer(ref_w, cfg, rng=9)
    cpu = quantrs.QatOptimizer(w, cfg, rng=9)
    for t in range(3):
        ref.step(ref_w, grads(t, n, np.float64))
        cpu.step(w, grads(t, n, np.float64))
    dev = cpu.to("cuda")
    assert dev is cpu and dev.device == "cuda:0"
    wd = qc.DeviceArray.from_numpy(w)
    for t in range(3, 6):
        ref.step(ref_w, grads(t, n, np.float64))
        dev.step(wd, qc.DeviceArray.from_numpy(grads(t, n, np.float64)))
    assert dev.memory_usage() >= 3 * 8 * n
    back, w = dev.to("cpu"), wd.numpy()
    assert back is dev and back.device == "cpu"
    for t in range(6, 8):
        ref.step(ref_w, grads(t, n, np.float64))
        back.step(w, grads(t, n, np.float64))
    assert np.array_equal(w, ref_w) and back.to_bytes() == ref.to_bytes()


@pytest.mark.parametrize("clip", [0.0, 0.01])
@pytest.mark.parametrize("scheme", ["symmetric", "affine"])
def test_calibrate_matches_the_cpu(clip, scheme):
    x = np.random.default_rng(4).standard_normal((37, 129)).astype(np.float32)
    xd = qc.DeviceArray.from_numpy(x)
    assert qc.calibrate(xd, "int4", scheme, clip_fraction=clip) == qat.calibrate(
        x, "int4", scheme, clip_fraction=clip
    )
    for axis in (0, 1):
        want = qat.calibrate(x, "int8", scheme, clip_fraction=clip, axis=axis)
        assert qc.calibrate(xd, "int8", scheme, clip_fraction=clip, axis=axis) == want
    x64 = qc.DeviceArray.from_numpy(x.astype(np.float64))
    assert qc.calibrate(x64, "int8", scheme) == qat.calibrate(x.astype(np.float64), "int8", scheme)
    bad = x.copy()
    bad[3, 5] = np.inf
    with pytest.raises(quantrs.QuantError) as want:
        qat.calibrate(bad, "int8", axis=0)
    with pytest.raises(type(want.value), match="channel 3"):
        qc.calibrate(qc.DeviceArray.from_numpy(bad), "int8", axis=0)


def test_qat_adamw_on_cuda_parameters_trains_as_on_cpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import quantrs.torch as qt

    torch.manual_seed(0)
    cpu_m = torch.nn.Linear(64, 32)
    gpu_m = torch.nn.Linear(64, 32).cuda()
    gpu_m.load_state_dict(cpu_m.state_dict())
    kw = dict(target="int4", lr=1e-2, weight_decay=0.01, rounding="stochastic", seed=3)
    cpu_o = qt.QatAdamW(cpu_m.parameters(), **kw)
    gpu_o = qt.QatAdamW(gpu_m.parameters(), **kw)
    # The same gradients on both sides (a CUDA forward would round differently).
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(cpu_m.parameters(), gpu_m.parameters()):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g.cuda()
        cpu_o.step()
        gpu_o.step()
    for a, b in zip(cpu_m.parameters(), gpu_m.parameters()):
        assert torch.equal(a.detach(), b.detach().cpu())
    sa, sb = cpu_o.state_dict()["state"], gpu_o.state_dict()["state"]
    for k in sa:
        for name in ("master", "exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][name], sb[k][name].cpu()), name
