"""quantrs.torch.AdamW4bit / Adam4bit against torch.optim.AdamW / Adam as the oracle.

A one-element parameter is a block of one: its moments sit exactly on a code (the block's
absmax), so the 4-bit state holds them without loss and the update matches torch's to
float32 rounding over many steps. That makes every hyper-parameter of every group, the
schedulers and state round trips checkable against torch exactly; larger tensors are
checked within the 4-bit state's error on a regression task.
"""

from __future__ import annotations

import io
import math
import tracemalloc

import numpy as np
import pytest
import torch

import quantrs
import quantrs.torch as qt

# Small tensors: one intra-op thread (OpenMP threads spin-waiting on a busy 2-core CI
# machine make torch ~30x slower here, and nothing below needs them).
torch.set_num_threads(1)

OPTIMIZERS = [(qt.AdamW4bit, torch.optim.AdamW), (qt.Adam4bit, torch.optim.Adam)]


def scalars(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(1, generator=g)) for _ in range(n)]


def clone_params(ps):
    return [torch.nn.Parameter(p.detach().clone()) for p in ps]


def grads_for(step, n):
    # Varying signs and magnitudes; deterministic.
    return [torch.tensor([math.sin(0.7 * step + 1.3 * k) * 10 ** (k % 3 - 1)]) for k in range(n)]


def run(opt, ps, steps, sched=None, start=0):
    for t in range(start, start + steps):
        for p, g in zip(ps, grads_for(t, len(ps))):
            p.grad = g.clone()
        opt.step()
        if sched is not None:
            sched.step()


# ---- the math against torch --------------------------------------------------------------


@pytest.mark.parametrize("lr,wd", [(0.1, 0.5), (1e-3, 1e-2), (0.25, 0.5), (3e-4, 0.1)])
def test_weight_decay_alone_is_exact(lr, wd):
    # With a zero gradient the Adam term is exactly 0 and only the decay moves the weight:
    # w - f32(lr * wd) * w in float32, bit for bit; torch's w * (1 - lr * wd) rounds the
    # same product differently, so torch agrees to an ulp per step.
    w0 = torch.randn(300, generator=torch.Generator().manual_seed(1))
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours = qt.AdamW4bit([a], lr=lr, weight_decay=wd)
    ref = torch.optim.AdamW([b], lr=lr, weight_decay=wd)
    want = w0.numpy().copy()
    for _ in range(5):
        a.grad, b.grad = torch.zeros(300), torch.zeros(300)
        ours.step()
        ref.step()
        want -= np.float32(lr * wd) * want
    assert np.array_equal(a.detach().numpy(), want)
    torch.testing.assert_close(a, b, rtol=5 * 2**-23, atol=0)
    assert not torch.equal(a, w0)


@pytest.mark.parametrize("ours_cls,ref_cls", OPTIMIZERS)
def test_groups_honour_every_hyper_parameter(ours_cls, ref_cls):
    ps = scalars(4)
    qs = clone_params(ps)
    groups = [
        dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
        dict(lr=3e-2, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.1),
        dict(lr=5e-3, betas=(0.0, 0.99), eps=1e-6, weight_decay=0.5),
    ]
    ours = ours_cls([dict(params=[ps[0], ps[1]], **groups[0])], lr=9.0)
    ref = ref_cls([dict(params=[qs[0], qs[1]], **groups[0])], lr=9.0)
    ours.add_param_group(dict(params=[ps[2]], **groups[1]))
    ref.add_param_group(dict(params=[qs[2]], **groups[1]))
    ours.add_param_group(dict(params=[ps[3]], **groups[2]))
    ref.add_param_group(dict(params=[qs[3]], **groups[2]))
    run(ours, ps, 40)
    run(ref, qs, 40)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=1e-7)
    # The groups differ enough that a swapped hyper-parameter would show.
    single = ours_cls(clone_params(ps[2:3]), **groups[0])
    pp = single.param_groups[0]["params"]
    run(single, pp, 40)
    assert not torch.allclose(pp[0], ps[2], rtol=1e-3)


@pytest.mark.parametrize("ours_cls,ref_cls", OPTIMIZERS)
@pytest.mark.parametrize(
    "make_sched",
    [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=30),
        # OneCycleLR also cycles betas[0] ("momentum") at every step.
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=30),
    ],
)
def test_schedulers(ours_cls, ref_cls, make_sched):
    ps = scalars(3, seed=2)
    qs = clone_params(ps)
    ours = ours_cls(ps, lr=0.02, weight_decay=0.01)
    ref = ref_cls(qs, lr=0.02, weight_decay=0.01)
    run(ours, ps, 30, make_sched(ours))
    run(ref, qs, 30, make_sched(ref))
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=2e-5, atol=1e-7)


def test_first_step_of_a_large_tensor_matches_torch():
    g = torch.Generator().manual_seed(3)
    w0, grad = torch.randn(37, 129, generator=g), torch.randn(37, 129, generator=g)
    a, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ours, ref = qt.AdamW4bit([a], lr=1e-2, weight_decay=0.1), torch.optim.AdamW([b], lr=1e-2)
    ref.param_groups[0]["weight_decay"] = 0.1
    a.grad, b.grad = grad.clone(), grad.clone()
    ours.step()
    ref.step()
    torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)


def _regression(opt_factory, steps=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 32, generator=g)
    y = x @ torch.randn(32, 8, generator=g) + 0.1 * torch.randn(256, 8, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    opt = opt_factory(model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_regression_within_the_4bit_error_of_torch_adamw():
    kw = dict(lr=3e-3, weight_decay=1e-2)
    ours = _regression(lambda p: qt.AdamW4bit(p, **kw))
    ref = _regression(lambda p: torch.optim.AdamW(p, **kw))
    # The first update starts from exact zero moments: the same loss after it.
    assert abs(ours[1] - ref[1]) <= 1e-6 * ref[1]
    # Then the 4-bit rounding of m and v accumulates: close early, the task learned by
    # both, and 4-bit state lagging float32 late in training by a bounded factor.
    assert abs(ours[5] - ref[5]) <= 5e-3 * ref[5]
    assert abs(ours[10] - ref[10]) <= 2e-2 * ref[10]
    assert ref[-1] < 0.05 * ref[0] and ours[-1] < 0.05 * ours[0]
    assert ours[-1] <= 3 * ref[-1]


# ---- the torch.optim.Optimizer contract ----------------------------------------------------


def test_closure_runs_with_grad_enabled_and_its_loss_is_returned():
    p = torch.nn.Parameter(torch.ones(4))
    opt = qt.AdamW4bit([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 4.0
    assert torch.all(p < 1)


def test_parameters_without_grad_are_skipped_and_zero_grad_clears():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = qt.AdamW4bit([a, b], lr=0.1)
    a.grad = torch.ones(3)
    opt.step()
    assert torch.equal(b, torch.ones(3)) and b not in opt.state
    assert float(opt.state[a]["step"]) == 1.0
    opt.zero_grad()
    assert a.grad is None
    opt.step()  # no gradient: nothing moves
    assert float(opt.state[a]["step"]) == 1.0


def test_updates_in_place_through_a_zero_copy_view():
    p = torch.nn.Parameter(torch.randn(64, 64))
    storage, alias = p.data_ptr(), p.detach()
    opt = qt.AdamW4bit([p], lr=0.1)
    p.grad = torch.randn(64, 64)
    before = p.detach().clone()
    opt.step()
    assert p.data_ptr() == storage
    assert torch.equal(alias, p.detach()) and not torch.equal(before, alias)


def test_state_is_about_one_byte_per_parameter():
    p = torch.nn.Parameter(torch.zeros(1 << 16))
    opt = qt.AdamW4bit([p])
    p.grad = torch.full((1 << 16,), 0.1)
    opt.step()
    sd = opt.state_dict()["state"][0]
    live = sum(t.numel() * t.element_size() for k, t in sd.items() if k != "step")
    assert opt.state_bytes() == live
    assert live / p.numel() <= 1.05
    assert sd["m_codes"].dtype == torch.uint8


# ---- state dicts -------------------------------------------------------------------------


def _trained(cls=qt.AdamW4bit, steps=5, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(70, 33), torch.nn.Linear(33, 5))
    opt = cls(model.parameters(), lr=1e-2, **kw)
    x = torch.randn(16, 70)
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return model, opt, x


def _continue(model, opt, x, steps=5):
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "cls,kw",
    [
        (qt.AdamW4bit, {}),
        (qt.Adam4bit, {"weight_decay": 0.1}),
        (qt.AdamW4bit, {"double_quantization": False, "variance_map": "log"}),
        (qt.AdamW4bit, {"rank1_normalization": True, "method": "int8", "block_size": 128}),
    ],
)
def test_resume_from_torch_save_is_bit_identical(cls, kw):
    model, opt, x = _trained(cls, **kw)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    want = _continue(model, opt, x)

    buf.seek(0)
    ck = torch.load(buf, weights_only=True)
    torch.manual_seed(1)  # other initial weights: everything must come from the checkpoint
    model2 = torch.nn.Sequential(torch.nn.Linear(70, 33), torch.nn.Linear(33, 5))
    opt2 = cls(model2.parameters(), lr=123.0, **kw)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["optim"])
    assert opt2.param_groups[0]["lr"] == 1e-2
    got = _continue(model2, opt2, x)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


def test_state_dict_follows_torch_conventions():
    model, opt, _ = _trained(steps=3)
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    assert sd["param_groups"][0]["params"] == [0, 1, 2, 3]
    for st in sd["state"].values():
        assert st["step"].dtype == torch.float64 and float(st["step"]) == 3.0
        assert all(isinstance(t, torch.Tensor) for t in st.values())
        assert st["m_codes"].dtype == st["v_codes"].dtype == torch.uint8
    # Sizes and dtypes do not change from step to step (in-place loading needs that).
    shapes = {i: {k: (t.shape, t.dtype) for k, t in st.items()} for i, st in sd["state"].items()}
    _continue(model, opt, torch.randn(16, 70), steps=20)
    sd2 = opt.state_dict()
    assert shapes == {
        i: {k: (t.shape, t.dtype) for k, t in st.items()} for i, st in sd2["state"].items()
    }
    # Between steps the optimizer keeps only the light state (the engines hold the rest).
    assert set(opt.state[next(model.parameters())]) == {"step"}


def test_codes_cast_to_float_load_exactly():
    # torch.optim.Optimizer.load_state_dict casts floating state to the parameter's dtype;
    # codes that went through a float cast somewhere come back exactly.
    model, opt, x = _trained()
    sd = opt.state_dict()
    for st in sd["state"].values():
        for k in list(st):
            if k.endswith("_codes"):
                st[k] = st[k].to(torch.float32)
    want = [t.clone() for t in opt.state_dict()["state"][0].values()]
    opt.load_state_dict(sd)
    got = list(opt.state_dict()["state"][0].values())
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_a_bad_state_changes_nothing():
    model, opt, x = _trained()
    good = opt.state_dict()
    snapshot = {i: {k: t.clone() for k, t in st.items()} for i, st in good["state"].items()}

    def broken(fn):
        sd = opt.state_dict()
        fn(sd)
        return sd

    cases = [
        broken(lambda sd: sd["state"][1].update(m_codes=sd["state"][1]["m_codes"][:-1])),
        broken(lambda sd: sd["state"][2].pop("v_codes")),
        broken(lambda sd: sd["state"][0].update(step=torch.tensor(-1.0))),
        broken(lambda sd: sd["state"][0].update(m_codes=sd["state"][0]["m_codes"] * 0.5)),
        broken(lambda sd: sd["state"][3].update(extra=torch.zeros(3))),
        broken(lambda sd: sd["param_groups"][0]["params"].pop()),
    ]
    for sd in cases:
        with pytest.raises((ValueError, TypeError)):
            opt.load_state_dict(sd)
        now = opt.state_dict()
        assert all(
            torch.equal(now["state"][i][k], t) for i, st in snapshot.items() for k, t in st.items()
        )


# ---- bad inputs --------------------------------------------------------------------------


def _bad_param_cases():
    yield "float64", torch.nn.Parameter(torch.ones(4, dtype=torch.float64)), TypeError
    yield "bfloat16", torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16)), TypeError
    yield "complex", torch.nn.Parameter(torch.ones(4, dtype=torch.complex64)), TypeError
    yield "strided", torch.nn.Parameter(torch.ones(4, 6).t()), ValueError
    yield "meta", torch.nn.Parameter(torch.ones(4, device="meta")), ValueError


@pytest.mark.parametrize("cls", [qt.AdamW4bit, qt.Adam4bit])
@pytest.mark.parametrize("case", list(_bad_param_cases()), ids=lambda c: c[0])
def test_bad_parameters_raise_before_anything_changes(cls, case):
    _, bad, exc = case
    good = torch.nn.Parameter(torch.ones(5))
    opt = cls([good, bad], lr=0.1)
    good.grad = torch.ones(5)
    bad.grad = torch.ones_like(bad)
    with pytest.raises(exc, match="parameter 1"):
        opt.step()
    assert torch.equal(good, torch.ones(5)) and good not in opt.state


@pytest.mark.parametrize(
    "make_grad,exc",
    [
        (lambda: torch.ones(5, dtype=torch.float64), TypeError),
        (lambda: torch.ones(5).to_sparse(), TypeError),
    ],
)
def test_bad_gradients_raise_before_anything_changes(make_grad, exc):
    a, b = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(5))
    opt = qt.AdamW4bit([a, b], lr=0.1)
    a.grad = torch.ones(5)
    b.grad_dtype = None  # torch refuses a gradient of another dtype unless told
    b.grad = make_grad()
    with pytest.raises(exc, match="parameter 1"):
        opt.step()
    assert torch.equal(a, torch.ones(5)) and a not in opt.state


def test_non_finite_gradient_raises_before_anything_changes():
    a, b = torch.nn.Parameter(torch.ones(5)), torch.nn.Parameter(torch.ones(5))
    opt = qt.AdamW4bit([a, b], lr=0.1)
    a.grad, b.grad = torch.ones(5), torch.ones(5)
    opt.step()
    before = opt.state_dict()
    before = {i: {k: t.clone() for k, t in st.items()} for i, st in before["state"].items()}
    wa = a.detach().clone()
    b.grad = torch.tensor([1.0, float("nan"), 1.0, 1.0, 1.0])
    with pytest.raises(quantrs.InvalidArgument, match="parameter 1"):
        opt.step()
    assert torch.equal(a, wa)
    now = opt.state_dict()["state"]
    assert all(torch.equal(now[i][k], t) for i, st in before.items() for k, t in st.items())


def test_non_contiguous_gradients_are_used_as_values():
    a, b = torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(3, 4))
    g = torch.randn(4, 3)
    qa, qb = qt.AdamW4bit([a], lr=0.1), qt.AdamW4bit([b], lr=0.1)
    a.grad, b.grad = g.t(), g.t().contiguous()
    qa.step()
    qb.step()
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(lr=-1.0), "lr"),
        (dict(betas=(1.0, 0.999)), "betas"),
        (dict(betas=(0.9,)), "betas"),
        (dict(eps=0.0), "eps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(lr=float("nan")), "lr"),
        (dict(block_size=63), "block_size"),
        (dict(method="nf3"), "method|nf3"),
    ],
)
def test_bad_hyper_parameters(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        qt.AdamW4bit([torch.nn.Parameter(torch.ones(3))], **kw)


def test_a_bad_group_change_raises_before_anything_changes():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = qt.AdamW4bit([{"params": [a]}, {"params": [b]}], lr=0.1)
    a.grad, b.grad = torch.ones(3), torch.ones(3)
    opt.param_groups[1]["lr"] = -0.5
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['lr'\]"):
        opt.step()
    assert torch.equal(a, torch.ones(3))
    # finite in float64 but not in the engines' float32: refused before any parameter moves
    for key, value in (("lr", 1e39), ("eps", 1e-50), ("weight_decay", 1e39)):
        opt.param_groups[1][key] = value
        with pytest.raises(ValueError, match=rf"param_groups\[1\]\['{key}'\].*float32"):
            opt.step()
        assert torch.equal(a, torch.ones(3)) and torch.equal(b, torch.ones(3))
        opt.param_groups[1][key] = {"lr": 0.1, "eps": 1e-8, "weight_decay": 1e-2}[key]
    opt.param_groups[1]["lr"] = 0.1
    opt.step()
    opt.param_groups[0]["block_size"] = 128
    with pytest.raises(ValueError, match="cannot change"):
        opt.step()


def test_importing_quantrs_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, quantrs; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_numpy_state_of_the_engine_is_what_torch_sees():
    # The exported tensors are the Rust engine's own arrays, key for key.
    p = torch.nn.Parameter(torch.randn(300))
    opt = qt.AdamW4bit([p], lr=0.1)
    p.grad = torch.randn(300)
    opt.step()
    engine = opt._slots[p].engine
    rust = engine.state_dict()
    st = opt.state_dict()["state"][0]
    for k, t in st.items():
        if k != "step":
            assert np.array_equal(rust["n:w/" + k], t.numpy()), k


def test_state_of_a_plain_engine_loads_as_a_torch_state():
    """The torch state format is the engine checkpoint's per-parameter arrays: a state
    made by a plain ``quantrs.AdamW4bit`` (never through the torch adapter) loads and
    continues bit-identically."""
    gen = torch.Generator().manual_seed(5)
    w0 = torch.randn(6, 50, generator=gen)
    grads = [torch.randn(6, 50, generator=gen) for _ in range(6)]
    plain = quantrs.AdamW4bit(learning_rate=1e-2, weight_decay=0.1)
    w = w0.numpy().copy()
    for g in grads[:3]:
        plain.update(w, g.numpy(), name="layer")
        plain.step()
    rust = plain.state_dict()
    arrays = {k.split("/", 1)[1]: torch.from_numpy(v) for k, v in rust.items() if "/" in k}
    p = torch.nn.Parameter(torch.from_numpy(w.copy()))
    opt = qt.AdamW4bit([p], lr=1e-2, weight_decay=0.1)
    opt.load_state_dict(
        {
            "state": {0: {"step": torch.tensor(3.0, dtype=torch.float64), **arrays}},
            "param_groups": [{**opt.param_groups[0], "params": [0]}],
        }
    )
    for g in grads[3:]:
        plain.update(w, g.numpy(), name="layer")
        plain.step()
        p.grad = g.clone()
        opt.step()
    assert np.array_equal(p.detach().numpy(), w)


def test_engine_param_state_import_is_checked_first():
    eng = quantrs.AdamW4bit(learning_rate=1e-2)
    w = np.linspace(-1, 1, 300, dtype=np.float32)
    eng.update(w, np.ones(300, np.float32), name="w")
    eng.step()
    step, arrays = eng.export_param_state("w")
    assert step == 1 and arrays["m_codes"].dtype == np.uint8
    before = eng.state_dict()
    bad = [
        # A declared size far beyond the bytes present: refused before allocating.
        (("w", (1 << 40,), 1, arrays), quantrs.SerializationError, "needs"),
        (("w", (300,), 1, {**arrays, "m_codes": arrays["m_codes"][:-1]}), Exception, "m_codes"),
        (("w", (300,), 1, {**arrays, "x": arrays["m_codes"]}), Exception, "unexpected"),
        (
            ("w", (300,), 1, {**arrays, "v_codes": arrays["v_codes"].astype(np.int16)}),
            TypeError,
            "v_codes",
        ),
        (("w", (300,), 2**60, arrays), Exception, "step"),
    ]
    for args, exc, match in bad:
        with pytest.raises(exc, match=match):
            eng.import_param_state(*args)
        after = eng.state_dict()
        assert all(np.array_equal(before[k], after[k]) for k in before)
    with pytest.raises(quantrs.InvalidState, match="name"):
        eng.export_param_state("other")
    with pytest.raises(ValueError, match="beta1"):
        eng.set_hyper(1e-2, 1.5, 0.999, 1e-8, 0.0)
    eng.import_param_state("v", (300,), 7, arrays)
    assert eng.export_param_state("v")[0] == 7 and eng.num_parameters() == 300


def test_a_group_change_copies_no_state():
    """tracemalloc sees Python-side buffers: the old path re-sealed a copy of the whole
    state (the engine's state_dict) whenever betas, eps or weight_decay changed."""
    n = 1 << 20
    p = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(0)))
    opt = qt.AdamW4bit([p], lr=1e-3)
    p.grad = torch.randn(n, generator=torch.Generator().manual_seed(1))
    opt.step()
    peaks = []
    for k in range(3):
        opt.param_groups[0]["betas"] = (0.9 - 0.01 * k, 0.99)
        opt.param_groups[0]["eps"] = 1e-8 * (k + 1)
        tracemalloc.start()
        opt.step()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert max(peaks) < n // 64, peaks  # the state is about n bytes
    o = opt._slots[p].engine.config().optimizer
    assert (o.beta1, o.beta2) == (np.float32(0.88), np.float32(0.99))
