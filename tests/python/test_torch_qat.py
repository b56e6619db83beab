"""quantrs.torch.QatAdamW: the quantized view in the parameters, the master against
torch.optim.AdamW, NumPy QatOptimizer as the oracle of the Rust step, state round trips."""

from __future__ import annotations

import io

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
