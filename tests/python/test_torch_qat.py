"""quantrs.torch.QatAdamW: the quantized view in the parameters, the master against
torch.optim.AdamW, NumPy QatOptimizer as the oracle of the Rust step, state round trips."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
import torch

import quantrs
import quantrs.torch as qt

# Small tensors: one intra-op thread (OpenMP threads spin-waiting on a busy 2-core CI
# machine make torch ~30x slower here, and nothing below needs them).
torch.set_num_threads(1)


def _on_int_grid(x: np.ndarray, bits: int) -> bool:
    """Symmetric per-tensor grid: every value a whole multiple of absmax / qmax."""
    qmax = 2 ** (bits - 1) - 1
    k = x.astype(np.float64) / (np.abs(x).max() / qmax)
    return bool(np.all(np.abs(k - np.round(k)) < 1e-3) and np.all(np.abs(k) <= qmax + 1e-3))


@pytest.mark.parametrize("target,bits", [("int8", 8), ("int4", 4)])
def test_parameters_hold_the_quantized_view_from_the_start(target, bits):
    p = torch.nn.Parameter(torch.randn(40, 30))
    w0 = p.detach().clone()
    opt = qt.QatAdamW([p], target=target, lr=1e-2)
    master = opt.state[p]["master"]
    assert torch.equal(master, w0)
    assert _on_int_grid(p.detach().numpy(), bits)
    ref = quantrs.fake_quant(w0.numpy(), target)
    np.testing.assert_array_equal(p.detach().numpy(), ref)


@pytest.mark.parametrize("target", ["int8", "int4", "fp8_e4m3", "fp8_e5m2"])
def test_steps_match_the_numpy_qat_optimizer(target):
    w0 = torch.randn(500, generator=torch.Generator().manual_seed(0))
    p = torch.nn.Parameter(w0.clone())
    opt = qt.QatAdamW([p], target=target, lr=1e-2, weight_decay=0.01, seed=5)
    master = w0.numpy().copy()
    cfg = quantrs.QatConfig(target, lr=1e-2, weight_decay=0.01)
    ref = quantrs.QatOptimizer(master, cfg, rng=0)
    for t in range(6):
        g = torch.randn(500, generator=torch.Generator().manual_seed(10 + t))
        p.grad = g.clone()
        opt.step()
        ref.step(master, g.numpy())
        assert np.array_equal(opt.state[p]["master"].numpy(), master)
        assert np.array_equal(p.detach().numpy(), ref.quantized_weights)


def test_master_follows_torch_adamw_with_a_scheduler():
    g0 = torch.Generator().manual_seed(1)
    w0 = torch.randn(64, generator=g0)
    p, q = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours = qt.QatAdamW([p], target="int8", lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)
    ref = torch.optim.AdamW([q], lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)
    s1 = torch.optim.lr_scheduler.OneCycleLR(ours, max_lr=0.05, total_steps=20)
    s2 = torch.optim.lr_scheduler.OneCycleLR(ref, max_lr=0.05, total_steps=20)
    for _ in range(20):
        g = torch.randn(64, generator=g0)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        s1.step()
        s2.step()
    torch.testing.assert_close(ours.state[p]["master"], q.detach(), rtol=1e-5, atol=1e-6)


def test_training_through_the_quantizer_reaches_the_grid_target():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1, bias=False)
    x = torch.randn(256, 16)
    w_true = torch.randn(1, 16)
    y = x @ w_true.t()
    opt = qt.QatAdamW(model.parameters(), target="int8", lr=5e-2)
    for _ in range(200):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    assert loss.item() < 1e-3
    assert _on_int_grid(model.weight.detach().numpy(), 8)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_resume_is_bit_identical(rounding):
    def make(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(20, 12), torch.nn.Linear(12, 3))

    def train(model, opt, first, n):
        for t in range(first, first + n):
            x = torch.randn(8, 20, generator=torch.Generator().manual_seed(t))
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()

    model = make(0)
    opt = qt.QatAdamW(model.parameters(), target="int4", lr=1e-2, rounding=rounding, seed=3)
    train(model, opt, 0, 4)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    train(model, opt, 4, 4)
    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    model2 = make(1)
    opt2 = qt.QatAdamW(model2.parameters(), target="int4", lr=0.3, rounding=rounding, seed=3)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["optim"])
    train(model2, opt2, 4, 4)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    sd = opt2.state_dict()["state"][0]
    assert set(sd) == {"step", "master", "exp_avg", "exp_avg_sq"} and float(sd["step"]) == 8


def test_bad_inputs_raise_before_anything_changes():
    with pytest.raises(ValueError, match="target"):
        qt.QatAdamW([torch.nn.Parameter(torch.ones(3))], target="int3")
    with pytest.raises(TypeError, match="parameter 1"):
        qt.QatAdamW([torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3).double())])
    zero = torch.nn.Parameter(torch.zeros(3))  # an int grid needs a nonzero absmax
    with pytest.raises(quantrs.InvalidState, match="parameter 1"):
        qt.QatAdamW([torch.nn.Parameter(torch.ones(3)), zero], target="int8")
    assert torch.equal(zero, torch.zeros(3))
    a, b = torch.nn.Parameter(torch.randn(4)), torch.nn.Parameter(torch.randn(4))
    opt = qt.QatAdamW([a, b], target="int8")
    wa = a.detach().clone()
    a.grad, b.grad = torch.ones(4), torch.ones(4).to_sparse()
    with pytest.raises(TypeError, match="parameter 1"):
        opt.step()
    assert torch.equal(a, wa)
    opt.param_groups[0]["target"] = "int4"
    b.grad = torch.ones(4)
    with pytest.raises(ValueError, match="cannot change"):
        opt.step()


# ---- hyper-parameters through the engine's setters ---------------------------------------


def _repatched(engine, shape, hyper=None, rounding=None, seed=None):
    """The old path, as the oracle: ``engine`` re-created from its byte form with fields
    replaced (docs/qat.md: magic, u32 version, u8 dtype, target, scheme and rounding codes,
    five f64 hyper-parameters at offset 12, u64 seed at 52, ..., CRC-32 of the rest)."""
    buf = bytearray(engine.to_bytes()[:-4])
    if hyper is not None:
        struct.pack_into("<5d", buf, 12, *hyper)
    if rounding is not None:
        buf[11] = {"nearest": 0, "stochastic": 1}[rounding]
    if seed is not None:
        struct.pack_into("<Q", buf, 52, seed)
    return quantrs.QatOptimizer.from_bytes(bytes(buf) + struct.pack("<I", zlib.crc32(buf)), shape)


def test_a_scheduler_matches_the_old_copy_path_bit_for_bit():
    n = 300
    gen = torch.Generator().manual_seed(4)
    w0 = torch.randn(n, generator=gen)
    p = torch.nn.Parameter(w0.clone())
    opt = qt.QatAdamW([p], target="int4", lr=1e-2, weight_decay=0.05, seed=9)
    # OneCycleLR moves lr and betas[0] at every step; the weight decay changes halfway.
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20)
    master = w0.numpy().copy()
    cfg = quantrs.QatConfig("int4", lr=1e-2, weight_decay=0.05)
    ref = quantrs.QatOptimizer(master, cfg, rng=qt._qat._seed(9, 0))
    for t in range(20):
        if t == 10:
            opt.param_groups[0]["weight_decay"] = 0.2
        if t == 14:  # rounding and seed are group settings too
            opt.param_groups[0]["rounding"] = "stochastic"
            opt.param_groups[0]["seed"] = 11
        grp = opt.param_groups[0]
        hyper = (grp["lr"], *grp["betas"], grp["eps"], grp["weight_decay"])
        ref = _repatched(ref, (n,), hyper, grp["rounding"], qt._qat._seed(grp["seed"], 0))
        g = torch.randn(n, generator=gen)
        p.grad = g.clone()
        opt.step()
        sched.step()
        ref.step(master, g.numpy())
        assert np.array_equal(opt.state[p]["master"].numpy(), master), t
        assert np.array_equal(p.detach().numpy(), ref.quantized_weights), t
    m, v = ref.moments()
    sd = opt.state_dict()["state"][0]
    assert np.array_equal(sd["exp_avg"].numpy(), m) and np.array_equal(sd["exp_avg_sq"].numpy(), v)


def test_a_hyper_parameter_change_copies_no_state():
    """tracemalloc sees every Python-side buffer (bytes, NumPy arrays): the old path
    allocated the whole state (to_bytes, 12 bytes per element) at every change."""
    n = 1 << 20
    p = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(0)))
    opt = qt.QatAdamW([p], target="int8", lr=1e-3)
    p.grad = torch.randn(n, generator=torch.Generator().manual_seed(1))
    opt.step()
    peaks = []
    for k in range(3):
        opt.param_groups[0]["lr"] = 1e-3 * (k + 2)
        opt.param_groups[0]["betas"] = (0.9 - 0.01 * k, 0.999)
        opt.param_groups[0]["weight_decay"] = 0.01 * k
        tracemalloc.start()
        opt.step()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert max(peaks) < n // 16, peaks  # the state is 12 * n bytes
    hyper = opt._slots[p].engine.config
    assert (hyper.lr, hyper.beta1, hyper.weight_decay) == (4e-3, 0.9 - 0.02, 0.02)


def test_bad_group_settings_change_nothing():
    p = torch.nn.Parameter(torch.randn(16))
    opt = qt.QatAdamW([p], target="int8", lr=1e-2)
    p.grad = torch.randn(16)
    opt.step()
    before = (p.detach().clone(), opt.state_dict())
    for key, value, err, match in [
        ("lr", -1.0, ValueError, "'lr'"),
        ("betas", (0.9, 1.0), ValueError, "betas"),
        ("eps", 0.0, ValueError, "'eps'"),
        ("rounding", "up", ValueError, "rounding"),
        ("seed", 1.5, TypeError, "'seed'"),
    ]:
        good = opt.param_groups[0][key]
        opt.param_groups[0][key] = value
        with pytest.raises(err, match=match):
            opt.step()
        opt.param_groups[0][key] = good
    assert torch.equal(p, before[0])
    after = opt.state_dict()
    assert float(after["state"][0]["step"]) == 1
    for k in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(after["state"][0][k], before[1]["state"][0][k])


def test_engine_setters_validate_and_name_the_argument():
    w = np.linspace(-1, 1, 8, dtype=np.float32)
    o = quantrs.QatOptimizer(w.copy(), "int8", rng=1)
    raw = o.to_bytes()
    for call, match in [
        (lambda: o.set_lr(float("nan")), "lr"),
        (lambda: o.set_betas(0.5, 1.0), "beta2"),
        (lambda: o.set_eps(-1.0), "eps"),
        (lambda: o.set_weight_decay(-0.1), "weight_decay"),
        (lambda: o.set_hyper(0.1, 0.9, 0.99, 1e-8, float("inf")), "weight_decay"),
        (lambda: o.set_rounding("up"), "rounding"),
        (lambda: o.set_moments(1, np.zeros(7, np.float32), np.zeros(8, np.float32)), "m"),
        (lambda: o.set_moments(1, np.zeros(8, np.float32), -np.ones(8, np.float32)), "v"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            call()
    assert o.to_bytes() == raw
    o.set_hyper(0.5, 0.8, 0.9, 1e-6, 0.25)
    o.set_rounding("stochastic")
    o.set_seed(2**64 - 1)
    c = o.config
    assert (c.lr, c.beta1, c.beta2, c.eps, c.weight_decay) == (0.5, 0.8, 0.9, 1e-6, 0.25)
    assert str(c.rounding).lower().endswith("stochastic") and o.seed == 2**64 - 1
