"""AdamW4bit / Adam4bit: hand-computed vectors, the step math against the float32 oracle, the
state layout, accumulation, the Python API, errors (docs/optim.md)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from _helpers import assert_gil_released
from hypothesis import given, settings
from hypothesis import strategies as st

import quantrs
from quantrs.reference import adam_step, decode_moments

kernel = pytest.mark.kernel


def make(method="nf4", lr=1e-2, wd=0.0, cls=quantrs.AdamW4bit, **q):
    return cls.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(lr, 0.9, 0.999, 1e-8, wd),
        quantrs.AdvancedQuantizationConfig(method, **q),
    )


def test_weight_decay_only_step_by_hand():
    opt = quantrs.AdamW4bit(0.1, 0.9, 0.999, 1e-8, 0.5)
    w = np.array([10.0], np.float32)
    opt.update(w, np.zeros(1, np.float32))
    assert w[0] == np.float32(9.5)


@kernel
@pytest.mark.parametrize("vmap", ["linear", "log", "sqrt_linear"])
def test_one_element_is_lossless(vmap):
    opt = make(variance_map=vmap)
    w = np.array([0.5], np.float32)
    wr, m, v = w.copy(), np.zeros(1, np.float32), np.zeros(1, np.float32)
    for t in range(1, 61):
        g = np.array([np.sin(0.7 * t) * 0.3], np.float32)
        opt.update(w, g, name="x")
        opt.step()
        adam_step(wr, g, m, v, t, 1e-2, 0.9, 0.999, 1e-8, 0.0)
    # linear/log maps hold v exactly; sqrt maps round v through sqrt(v)^2 (1 ulp).
    np.testing.assert_allclose(w, wr, rtol=1e-6 if vmap != "sqrt_linear" else 1e-5)


@kernel
@pytest.mark.parametrize("method", ["nf4", "int4", "dynamic", "int8"])
@pytest.mark.parametrize("decoupled", [True, False])
def test_first_step_equals_float32(method, decoupled):
    # From the zero state the first step sees exact m = v = 0.
    rng = np.random.default_rng(3)
    w = rng.standard_normal((13, 21)).astype(np.float32)
    g = rng.standard_normal((13, 21)).astype(np.float32)
    cls = quantrs.AdamW4bit if decoupled else quantrs.Adam4bit
    opt = make(method, lr=1e-2, wd=0.1, cls=cls)
    wr = w.copy()
    opt.update(w, g)
    m, v = np.zeros_like(w), np.zeros_like(w)
    adam_step(wr, g, m, v, 1, 1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled)
    np.testing.assert_allclose(w, wr, rtol=2e-6, atol=1e-7)


@kernel
@pytest.mark.parametrize("dq", [True, False])
def test_decoded_moments_within_codebook_error(dq):
    rng = np.random.default_rng(5)
    n = 64 * 300 + 10  # more than one group of 256 blocks, with a tail
    w = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * np.exp(rng.uniform(-6, 0, n))).astype(np.float32)
    opt = make(double_quantization=dq, variance_map="sqrt_linear")
    opt.update(w, g, name="w")
    sd = opt.state_dict()
    md, vd = decode_moments(sd, "n:w")
    m, v = np.float32(0.1) * g, np.float32(0.001) * g * g
    blocks = np.arange(n) // 64
    m_absmax = np.maximum.reduceat(np.abs(m), np.arange(0, n, 64))[blocks]
    u_max = np.maximum.reduceat(np.sqrt(v), np.arange(0, n, 64))[blocks]
    slack = 1.0 + 1e-6
    if dq:  # a decoded scale exceeds the absmax by at most one log step 2^-step
        for which in "mv":
            _, step = sd[f"n:w/{which}_scale_groups"].T
            slack = max(slack, float(np.max(np.exp2(-step.astype(np.float64)))) * (1 + 1e-5))
        assert slack < 1.05
    # NF4's largest gap is -1 .. -0.6961928: half of it bounds the rounding error.
    assert np.all(np.abs(md - m) <= 0.1520 * m_absmax * slack + 1e-12)
    # sqrt_linear: k/16 on sqrt(v), half a step of error above the first code, and
    # everything below it decodes to the first code: a positive v never decodes to 0.
    err = np.abs(np.sqrt(vd) - np.sqrt(v))
    big = np.sqrt(v) >= u_max / 16
    assert np.all(err[big] <= u_max[big] * slack / 32 + 1e-12)
    assert np.all(err <= u_max * slack / 16 + 1e-12)
    assert np.all(vd[v > 0] > 0)


@kernel
def test_zero_grad_elements_stay_exactly_unchanged():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(200).astype(np.float32)
    w0 = w.copy()
    opt = make(lr=1e-2)
    frozen = np.arange(200) % 5 == 0
    for _ in range(300):
        g = rng.standard_normal(200).astype(np.float32)
        g[frozen] = 0.0
        opt.update(w, g)
        opt.step()
    assert np.array_equal(w[frozen].view(np.uint32), w0[frozen].view(np.uint32))
    assert np.all(w[~frozen] != w0[~frozen])


@kernel
def test_accumulating_four_equals_one_update_with_the_mean():
    rng = np.random.default_rng(1)
    gs = [rng.standard_normal((7, 9)).astype(np.float32) for _ in range(4)]
    w0 = rng.standard_normal((7, 9)).astype(np.float32)
    a, b = make(), make()
    wa, wb = w0.copy(), w0.copy()
    for g in gs:
        a.accumulate_grad(wa, g, name="w")
    assert np.array_equal(wa, w0)  # accumulation does not touch the parameter
    a.apply_accumulated_grads(4)
    mean = (((gs[0] + gs[1]) + gs[2]) + gs[3]) / np.float32(4)
    b.update(wb, mean, name="w")
    assert np.array_equal(wa, wb)
    assert a.state_dict().keys() == b.state_dict().keys()
    for k, x in a.state_dict().items():
        assert np.array_equal(x, b.state_dict()[k]), k
    # The buffers were cleared: applying again changes nothing.
    a.apply_accumulated_grads(4)
    assert np.array_equal(wa, wb)


def test_zero_grad_clears_accumulation_and_bad_steps_raise():
    opt = make()
    w = np.ones(8, np.float32)
    opt.accumulate_grad(w, np.ones(8, np.float32))
    opt.zero_grad()
    opt.apply_accumulated_grads(1)
    assert np.all(w == 1) and opt.num_parameters() == 0
    opt.accumulate_grad(w, np.ones(8, np.float32))
    with pytest.raises(quantrs.InvalidArgument, match="accumulation_steps"):
        opt.apply_accumulated_grads(0)
    assert np.all(w == 1)
    with pytest.raises(quantrs.InvalidArgument, match="grad"):
        opt.accumulate_grad(w, np.full(8, np.inf, np.float32))


def test_keys_named_and_by_identity():
    opt = make()
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    g = np.full(4, 0.5, np.float32)
    opt.update(a, g)
    opt.update(b, g)
    opt.update(a, g)
    opt.update(a, g, name="emb")
    assert set(opt.state().params) == {"p:0", "p:1", "n:emb"}
    assert opt.state().params["p:0"] == (4,)
    assert opt.num_parameters() == 12


def test_memory_is_measured_from_live_buffers():
    opt = make()
    assert opt.memory_savings() == 0.0
    assert opt.memory_usage().total_bytes == 0
    n = 1 << 16
    w = np.zeros(n, np.float32)
    opt.update(w, np.full(n, 0.1, np.float32), name="w")
    mu = opt.memory_usage()
    sd = opt.state_dict()
    live = sum(x.nbytes for k, x in sd.items() if k not in ("meta", "config"))
    assert mu.total_bytes == live == opt.state().total_bytes
    assert mu.num_parameters == mu.momentum_elements == mu.variance_elements == n
    assert mu.third_moment_elements == 0
    assert mu.total_bytes / n <= 1.05
    assert opt.memory_savings() == pytest.approx(1 - mu.total_bytes / (8 * n), rel=1e-6)
    assert sd["n:w/m_codes"].dtype == np.uint8 and sd["n:w/m_codes"].size == n // 2
    # Every option shows in the buffers: f32 scales, int8 m, rank-1 statistics.
    for kw, extra in [
        ({"double_quantization": False}, 2 * 3 * n // 64),
        ({"method": "int8"}, n // 2),
    ]:
        o = make(**kw)
        o.update(np.zeros(n, np.float32), np.full(n, 0.1, np.float32))
        assert o.memory_usage().total_bytes >= mu.total_bytes + extra * 0.9
    o = make(rank1_normalization=True)
    o.update(np.zeros((256, 256), np.float32), np.full((256, 256), 0.1, np.float32), name="W")
    assert "n:W/v_rank1_rows" in o.state_dict()


@kernel
def test_scale_clamps_are_honoured():
    n = 640
    g = np.linspace(-3, 3, n).astype(np.float32)
    opt = make(max_scale=1e-3, double_quantization=False)
    opt.update(np.zeros(n, np.float32), g, name="w")
    sd = opt.state_dict()
    assert sd["n:w/m_scales"].max() == np.float32(1e-3)
    md, vd = decode_moments(sd, "n:w")
    assert np.abs(md).max() <= 1e-3 and np.sqrt(vd).max() <= 1e-3 * 1.0001
    opt = make(min_scale=1e-2, double_quantization=False)
    opt.update(np.zeros(n, np.float32), np.full(n, 1e-6, np.float32), name="w")
    assert opt.state_dict()["n:w/m_scales"].min() == np.float32(1e-2)


def test_lr_property_and_config():
    opt = quantrs.AdamW4bit()
    assert opt.lr == opt.get_lr() == 1e-3
    opt.lr = 0.5
    assert opt.get_lr() == 0.5
    opt.set_lr(0.25)
    assert opt.lr == 0.25 and opt.config_dict()["learning_rate"] == 0.25
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(quantrs.InvalidArgument, match="learning_rate"):
            opt.set_lr(bad)
    assert opt.lr == 0.25
    c = opt.config_dict()
    assert c["method"] == "nf4" and c["block_size"] == 64 and c["double_quantization"] is True
    assert c["variance_map"] == "sqrt_log"
    # config() is the config object: the two halves as their classes.
    cfg = opt.config()
    assert isinstance(cfg, quantrs.Adam4bitConfig)
    assert cfg.optimizer == quantrs.Adam4bitOptimizerConfig(0.25)
    assert cfg.quantization == quantrs.AdvancedQuantizationConfig()
    assert cfg.optimizer.learning_rate == 0.25 and cfg.quantization.block_size == 64
    assert cfg == opt.config() and cfg != quantrs.AdamW4bit().config()
    assert repr(cfg).startswith("Adam4bitConfig(optimizer=Adam4bitOptimizerConfig(")


@pytest.mark.parametrize("cls", [quantrs.AdamW4bit, quantrs.Adam4bit])
def test_config_has_the_hyper_parameters_as_fields(cls):
    # The Rust Adam4bitOptimizerConfig's fields read on config() itself, and
    # equal those of its .optimizer half (float32 values, shortest repr).
    opt = cls(0.1, 0.8, 0.99, 1e-6, 0.5)
    cfg = opt.config()
    fields = ("learning_rate", "beta1", "beta2", "epsilon", "weight_decay")
    assert [getattr(cfg, f) for f in fields] == [0.1, 0.8, 0.99, 1e-6, 0.5]
    assert [getattr(cfg, f) for f in fields] == [getattr(cfg.optimizer, f) for f in fields]
    opt.set_lr(0.03)
    assert opt.config().learning_rate == 0.03 and cfg.learning_rate == 0.1
    with pytest.raises(AttributeError):
        cfg.learning_rate = 1.0  # type: ignore[misc]


def test_repr_reads_like_the_constructor():
    ns = {k: getattr(quantrs, k) for k in quantrs.__all__}
    for opt in [
        quantrs.AdamW4bit(0.1, 0.9, 0.999, 1e-8, 0.5),
        quantrs.Adam4bit(),
        make("int8", block_size=128, rank1_normalization=True, variance_map="log"),
    ]:
        again = eval(repr(opt), ns)
        assert type(again) is type(opt) and again.config() == opt.config()
    q = quantrs.AdvancedQuantizationConfig("int4", 32)
    assert eval(repr(q), ns) == q
    o = quantrs.Adam4bitOptimizerConfig(2e-3)
    assert eval(repr(o), ns) == o and pickle.loads(pickle.dumps(o)) == o
    assert pickle.loads(pickle.dumps(q)) == q
    assert quantrs.AdvancedQuantizationConfig(quantrs.QuantizationMethod.INT8).method == "int8"


@kernel
def test_pickle_round_trip_continues_identically():
    rng = np.random.default_rng(2)
    w = rng.standard_normal(1000).astype(np.float32)
    opt = make(wd=0.01)
    for _ in range(3):
        opt.update(w, rng.standard_normal(1000).astype(np.float32), name="w")
        opt.step()
    clone = pickle.loads(pickle.dumps(opt))
    assert repr(clone) == repr(opt) and clone.state().step == 3
    w2 = w.copy()
    g = rng.standard_normal(1000).astype(np.float32)
    opt.update(w, g, name="w")
    clone.update(w2, g, name="w")
    assert np.array_equal(w, w2)


def _snapshot(opt):
    return {k: v.copy() for k, v in opt.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_bad_inputs_raise_before_anything_changes():
    opt = make()
    w = np.ones((4, 6), np.float32)
    g = np.full((4, 6), 0.1, np.float32)
    opt.update(w, g, name="w")
    before, w_before = _snapshot(opt), w.copy()
    cases = [
        (TypeError, lambda: opt.update(w.astype(np.float64), g, name="w")),
        (quantrs.DimensionMismatch, lambda: opt.update(w, g.reshape(6, 4), name="w")),
        (quantrs.DimensionMismatch, lambda: opt.update(w, g[:3], name="w")),
        (quantrs.DimensionMismatch, lambda: opt.update(w[:2].copy(), g[:2], name="w")),
        (ValueError, lambda: opt.update(w[:, ::2], g[:, ::2], name="w")),
        (ValueError, lambda: opt.update(w, w, name="w")),
        (quantrs.InvalidArgument, lambda: opt.update(np.ones(0, np.float32), np.ones(0))),
        (TypeError, lambda: opt.update([1.0, 2.0], [0.1, 0.2])),
        (TypeError, lambda: opt.update(w, np.full((4, 6), "x"), name="w")),
    ]
    ro = w.copy()
    ro.flags.writeable = False
    cases.append((ValueError, lambda: opt.update(ro, g, name="w")))
    for bad in (np.nan, np.inf, -np.inf):
        gb = g.copy()
        gb[2, 3] = bad
        cases.append((quantrs.InvalidArgument, lambda gb=gb: opt.update(w, gb, name="w")))
    for exc, call in cases:
        with pytest.raises(exc):
            call()
        assert np.array_equal(w, w_before)
        assert _same(_snapshot(opt), before)
        assert opt.state().step == 0


def test_bad_configs_raise():
    Q, Opt = quantrs.AdvancedQuantizationConfig, quantrs.Adam4bitOptimizerConfig
    for kw in [{"block_size": 0}, {"block_size": 63}, {"min_scale": 0.0}, {"max_scale": np.inf}]:
        with pytest.raises(quantrs.InvalidArgument):
            Q(**kw)
    with pytest.raises(quantrs.InvalidArgument, match="min_scale"):
        Q(min_scale=1.0, max_scale=0.5)
    with pytest.raises(quantrs.InvalidArgument, match="method"):
        Q("fp4")
    with pytest.raises(quantrs.InvalidArgument, match="variance_map"):
        Q(variance_map="cubic")
    with pytest.raises(quantrs.UnsupportedOperation, match="adaptation_rate"):
        Q(adaptation_rate=0.5)
    with pytest.raises(TypeError):
        Q(3)
    for args in [(np.nan,), (1e-3, 1.0), (1e-3, 0.9, -0.1), (1e-3, 0.9, 0.999, 0.0)]:
        with pytest.raises(quantrs.InvalidArgument):
            Opt(*args)
        with pytest.raises(quantrs.InvalidArgument):
            quantrs.AdamW4bit(*args)
    with pytest.raises(quantrs.InvalidArgument, match="weight_decay"):
        quantrs.Adam4bit(1e-3, 0.9, 0.999, 1e-8, -1.0)


def test_gil_is_released_during_the_step():
    n = 1 << 22
    w = np.zeros(n, np.float32)
    g = np.full(n, 0.1, np.float32)
    opt = quantrs.AdamW4bit()
    opt.update(w, g)

    def work():
        for _ in range(5):
            opt.update(w, g)

    assert_gil_released(work)


@kernel
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    scale=st.sampled_from([0.0, 1e-40, 1e-30, 1e-3, 1.0, 1e15]),
    special=st.sampled_from(["none", "zeros", "negzero", "const"]),
    seed=st.integers(0, 2**16),
)
def test_first_step_matches_oracle_on_odd_values(n, scale, special, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32)
    g = (rng.standard_normal(n) * scale).astype(np.float32)
    if special == "zeros":
        g[::2] = 0
    elif special == "negzero":
        g[:] = -0.0
    elif special == "const":
        g[:] = np.float32(scale)
    opt = make(lr=1e-3)
    wr = w.copy()
    opt.update(w, g)
    opt.step()
    adam_step(wr, g, np.zeros(n, np.float32), np.zeros(n, np.float32), 1, 1e-3, 0.9, 0.999, 1e-8, 0)
    np.testing.assert_allclose(w, wr, rtol=2e-6, atol=1e-9)
    # A second step keeps everything finite.
    opt.update(w, g)
    assert np.all(np.isfinite(w))
