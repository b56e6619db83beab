"""QatOptimizer and quantrs.qat against the NumPy reference (docs/qat.md)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import quantrs
from quantrs import qat
from quantrs.reference import qat as ref

TARGETS = ["int8", "int4", "fp8_e4m3", "fp8_e5m2"]
INT_TARGETS = ["int8", "int4"]


def _state(opt):
    m, v = opt.moments()
    p = opt.quant_params()
    return (
        opt.quantized_weights.copy(),
        m.copy(),
        v.copy(),
        opt.step_count(),
        None if p is None else (p.scale, p.zero_point, p.qmin, p.qmax),
    )


def _assert_same_state(a, b):
    for x, y in zip(a[:3], b[:3]):
        np.testing.assert_array_equal(x, y)
    assert a[3:] == b[3:]


# --- the original's vectors ---------------------------------------------------


def test_int8_symmetric_absmax_12_7_gives_scale_0_1():
    p = quantrs.QuantParams.from_absmax(12.7, "int8")
    assert p.scale == pytest.approx(0.1, rel=1e-15)
    assert (p.zero_point, p.qmin, p.qmax) == (0, -127, 127)
    w = np.array([12.7, -12.7, 0.04, 3.14])
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8"))
    assert opt.quant_params() == p
    np.testing.assert_allclose(opt.quantized_weights, [12.7, -12.7, 0.0, 3.1], atol=1e-12)


def test_int4_absmax_7_gives_scale_1():
    p = quantrs.QuantParams.from_absmax(7.0, "int4")
    assert p.scale == 1.0
    w = np.array([7.0, -7.0, 2.4, -3.5, 2.5])
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig(quantrs.QuantTarget.INT4))
    assert opt.quant_params().scale == 1.0
    np.testing.assert_array_equal(opt.quantized_weights, [7.0, -7.0, 2.0, -4.0, 2.0])


def test_fp8_vectors():
    x = np.array([1.1, 449.0, 1000.0, np.inf, -1000.0], dtype=np.float32)
    out = qat.fake_quant(x, "fp8_e4m3")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.125, 448.0, 448.0, 448.0, -448.0])
    assert qat.fake_quant(np.array([60000.0]), "fp8_e5m2")[0] == 57344.0
    assert np.isnan(qat.fake_quant(np.array([np.nan]), "fp8_e4m3")[0])
    opt = quantrs.QatOptimizer(np.array([1.1, 449.0, -1000.0]), quantrs.QatConfig("fp8_e4m3"))
    np.testing.assert_array_equal(opt.quantized_weights, [1.125, 448.0, -448.0])
    assert opt.quant_params() is None


def test_stochastic_3_07_averages_and_lands_on_neighbours():
    p = quantrs.QuantParams(0.1, 0, -127, 127)
    x = np.full(200_000, 3.07)
    out = p.fake_quant(x, "stochastic", rng=1)
    lo, hi = 30 * 0.1, 31 * 0.1
    assert set(np.unique(out)) <= {lo, hi}
    assert abs(out.mean() - 3.07) < 1e-3
    codes = p.quantize(x, quantrs.RoundingMode.STOCHASTIC, rng=1)
    assert codes.dtype == np.int8 and set(np.unique(codes)) == {30, 31}
    np.testing.assert_array_equal((codes - 0) * 0.1, out)


def test_all_zero_master_errors():
    for target in INT_TARGETS:
        with pytest.raises(quantrs.InvalidState, match="all-zero"):
            quantrs.QatOptimizer(np.zeros(8), quantrs.QatConfig(target))
    with pytest.raises(quantrs.InvalidState):
        quantrs.QatOptimizer(np.zeros(0), quantrs.QatConfig("int8"))


# --- AdamW against the float64 oracle ----------------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("target", "scheme"),
    [(t, s) for t in INT_TARGETS for s in ["symmetric", "affine"]]
    + [(t, "symmetric") for t in ["fp8_e4m3", "fp8_e5m2"]],
)
def test_steps_match_numpy_oracle(target, scheme):
    rng = np.random.default_rng(0)
    n = 4099  # odd: SIMD tails
    w = rng.standard_normal(n)
    hyper = dict(lr=3e-2, beta1=0.8, beta2=0.99, eps=1e-8, weight_decay=0.1)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig(target, scheme, **hyper), rng=0)
    rw, m, v = w.copy(), np.zeros(n), np.zeros(n)
    for t in range(1, 6):
        g = rng.standard_normal(n) * 10.0**-t
        opt.step(w, g)
        rw, m, v, rq = ref.qat_step(rw, g, m, v, t, target, scheme, **hyper)
        np.testing.assert_array_equal(w, rw)
        om, ov = opt.moments()
        np.testing.assert_array_equal(om, m)
        np.testing.assert_array_equal(ov, v)
        np.testing.assert_array_equal(opt.quantized_weights, rq)
        if target in INT_TARGETS:
            scale, zp, qmin, qmax = ref.calibrate(rw, target, scheme)
            p = opt.quant_params()
            assert (p.scale, p.zero_point, p.qmin, p.qmax) == (scale, zp, qmin, qmax)
    assert opt.step_count() == 5


@pytest.mark.kernel
def test_float32_master_tracks_float64_oracle():
    rng = np.random.default_rng(1)
    w64 = rng.standard_normal(1000)
    w = w64.astype(np.float32)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8", lr=1e-2, weight_decay=0.01))
    assert opt.dtype == "float32" and opt.quantized_weights.dtype == np.float32
    rw, m, v = w.astype(np.float64), np.zeros(1000), np.zeros(1000)
    for t in range(1, 4):
        g = rng.standard_normal(1000).astype(np.float32)
        opt.step(w, g)
        rw, m, v = ref.adamw_step(rw, g, m, v, t, lr=1e-2, weight_decay=0.01)
        np.testing.assert_allclose(w, rw, rtol=1e-5, atol=1e-6)
    scale, zp, qmin, qmax = ref.calibrate(w, "int8")
    np.testing.assert_allclose(
        opt.quantized_weights, ref.fake_quant_int(w, scale, zp, qmin, qmax), atol=1e-6
    )


def test_nd_master_keeps_its_shape():
    w = np.random.default_rng(2).standard_normal((3, 5, 7))
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8"))
    assert opt.shape == (3, 5, 7) and opt.quantized_weights.shape == (3, 5, 7)
    opt.step(w, np.ones((3, 5, 7)))
    with pytest.raises(quantrs.DimensionMismatch):
        opt.step(w.reshape(15, 7), np.ones((15, 7)))


# --- fake quant against the reference ---------------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize("target", INT_TARGETS)
@pytest.mark.parametrize("scheme", ["symmetric", "affine"])
@pytest.mark.parametrize("clip", [0.0, 0.01, 0.2])
def test_fake_quant_matches_reference(target, scheme, clip):
    x = np.random.default_rng(3).standard_t(3, size=5001) + 0.3
    out = qat.fake_quant(x, target, scheme, clip_fraction=clip)
    expected = ref.fake_quant(x, target, scheme, clip)
    if clip == 0.0:
        np.testing.assert_array_equal(out, expected)
    else:  # quantile interpolation may differ in the last bit
        scale = ref.calibrate(x, target, scheme, clip)[0]
        assert np.max(np.abs(out - expected)) <= scale * (1 + 1e-9)
        assert np.mean(out == expected) > 0.99
        p = qat.calibrate(x, target, scheme, clip_fraction=clip)
        assert p.scale == pytest.approx(scale, rel=1e-12)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("scheme", ["symmetric", "affine"])
def test_per_channel(axis, scheme):
    x = np.random.default_rng(4).standard_normal((6, 9)) * np.arange(1, 10)
    params = qat.calibrate(x, "int4", scheme, axis=axis)
    assert len(params) == x.shape[axis]
    out = qat.fake_quant(x, "int4", scheme, axis=axis)
    np.testing.assert_array_equal(out, ref.fake_quant(x, "int4", scheme, axis=axis))
    c = 2
    row = x[c] if axis == 0 else x[:, c]
    assert params[c] == qat.calibrate(row, "int4", scheme)
    with pytest.raises(quantrs.DimensionMismatch):
        qat.fake_quant(x.ravel(), "int4", axis=0)
    with pytest.raises(quantrs.InvalidArgument, match="axis"):
        qat.calibrate(x, "int8", axis=2)


@pytest.mark.kernel
@pytest.mark.parametrize("target", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_grid_matches_reference_and_ml_dtypes(target):
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 6, 3000),
            [0.0, -0.0, 2.0**-9, 2.0**-10, 2.0**-17, 1e-30, 464.0, 465.0, 61439.0, 61440.0],
        ]
    )
    out = qat.fake_quant(x, target)
    np.testing.assert_array_equal(out, ref.fp8_round(x, target))
    ml_dtypes = pytest.importorskip("ml_dtypes")
    fmt = ml_dtypes.float8_e4m3fn if target == "fp8_e4m3" else ml_dtypes.float8_e5m2
    x32 = x.astype(np.float32)
    fmax = 448.0 if target == "fp8_e4m3" else 57344.0
    expected = np.clip(x32, -fmax, fmax).astype(fmt).astype(np.float32)
    np.testing.assert_array_equal(qat.fake_quant(x32, target), expected)


def test_fp8_float64_is_rounded_once():
    # Just above the E4M3 tie 1.0625: a float32 detour would round to 1.0.
    x = np.array([1.0625 + 1e-12, 1.0625, -(1.0625 + 1e-12)])
    np.testing.assert_array_equal(qat.fake_quant(x, "fp8_e4m3"), [1.125, 1.0, -1.125])


def test_stochastic_fp8_is_unbiased():
    x = np.full(100_000, 1.1)
    out = qat.fake_quant(x, "fp8_e4m3", rounding="stochastic", rng=3)
    assert set(np.unique(out)) == {1.0, 1.125}
    assert abs(out.mean() - 1.1) < 2e-3


def test_quant_params_roundtrip_and_validation():
    p = quantrs.QuantParams.from_minmax(-1.0, 3.0, "int8")
    assert p.qmin == -128 and p.qmax == 127
    assert p == quantrs.QuantParams.from_minmax(-1.0, 3.0, "int8", quantrs.QuantScheme.AFFINE)
    scale, zp, _, _ = ref.qparams_minmax(-1.0, 3.0, "int8", "affine")
    assert (p.scale, p.zero_point) == (scale, zp)
    q = p.quantize(np.array([-1.0, 0.0, 3.0]))
    np.testing.assert_array_equal(q, [-128, zp, 127])
    np.testing.assert_allclose(p.dequantize(q), [-1.0, 0.0, 3.0], atol=p.scale / 2)
    assert eval(repr(p), {"QuantParams": quantrs.QuantParams}) == p
    assert pickle.loads(pickle.dumps(p)) == p
    wide = quantrs.QuantParams(0.5, 10, 0, 255)
    assert wide.quantize(np.array([1.0])).dtype == np.int32
    with pytest.raises(quantrs.InvalidArgument, match="scale"):
        quantrs.QuantParams(0.0, 0, -127, 127)
    with pytest.raises(quantrs.InvalidArgument, match="zero_point"):
        quantrs.QuantParams(1.0, 200, -127, 127)
    with pytest.raises(quantrs.InvalidArgument, match="qmin"):
        quantrs.QuantParams(1.0, 0, 5, 5)
    with pytest.raises(quantrs.InvalidArgument, match="outside"):
        p.dequantize(np.array([300]))
    with pytest.raises(TypeError):
        p.dequantize(np.array([1.5]))
    with pytest.raises(quantrs.InvalidArgument, match="NaN"):
        p.quantize(np.array([0.0, np.nan]))
    with pytest.raises(quantrs.InvalidArgument, match="integer target"):
        quantrs.QuantParams.from_absmax(1.0, "fp8_e4m3")
    with pytest.raises(quantrs.InvalidArgument, match="clip_fraction"):
        qat.calibrate(np.ones(4), clip_fraction=0.5)
    with pytest.raises(quantrs.InvalidArgument, match="index 2"):
        qat.calibrate(np.array([1.0, 2.0, np.inf]))


def test_fake_quant_backward_matches_reference():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(1000) * 2
    x[:3] = [np.nan, -1.5, 1.5]
    g = rng.standard_normal(1000)
    p = quantrs.QuantParams.from_absmax(1.5, "int8")
    out = qat.fake_quant_backward(g, x, p.lo, p.hi)
    np.testing.assert_array_equal(out, ref.fake_quant_backward(g, x, p.lo, p.hi))
    assert out[0] == 0.0 and out[1] == g[1] and out[2] == g[2]
    g32 = g.astype(np.float32)
    assert qat.fake_quant_backward(g32, x.astype(np.float32), -1, 1).dtype == np.float32
    mixed = qat.fake_quant_backward(g32, np.array([1.0 + 1e-12] * 1000), -1, 1)
    assert mixed.dtype == np.float64 and not mixed.any()  # x is not rounded to 1.0
    with pytest.raises(quantrs.DimensionMismatch):
        qat.fake_quant_backward(g, x[:10], -1, 1)
    # The bounds in either order (as the original API took them); NaN is an error.
    np.testing.assert_array_equal(
        qat.fake_quant_backward(g, x, p.hi, p.lo), ref.fake_quant_backward(g, x, p.lo, p.hi)
    )
    with pytest.raises(quantrs.InvalidArgument, match="lo"):
        qat.fake_quant_backward(g, x, float("nan"), 1)


# --- zero-copy, in place ------------------------------------------------------


def test_master_updated_in_place_and_view_is_zero_copy():
    w = np.random.default_rng(7).standard_normal(64)
    before = w.copy()
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8", lr=0.1))
    a = opt.quantized_weights
    b = opt.quantized_weights
    assert np.shares_memory(a, b)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1.0
    assert isinstance(a.base, quantrs.QatOptimizer)
    old = a.copy()
    opt.step(w, np.ones(64))
    assert not np.array_equal(w, before)  # the caller's array changed
    assert not np.array_equal(a, old)  # the earlier view shows the new values
    del opt
    assert np.isfinite(a).all()  # the view keeps the optimizer alive


def test_view_outlives_optimizer_reference():
    def make():
        return quantrs.QatOptimizer(np.arange(1.0, 9.0), "int8").quantized_weights

    v = make()
    np.testing.assert_allclose(v, np.arange(1.0, 9.0), atol=8 / 127)


# --- every failure mode leaves the state untouched ---------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_failures_leave_state_untouched(target):
    rng = np.random.default_rng(8)
    w = rng.standard_normal(100)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig(target, lr=0.5), rng=1)
    opt.step(w, rng.standard_normal(100))
    w_before, state = w.copy(), _state(opt)

    bad_grads = {
        "nan": np.where(np.arange(100) == 17, np.nan, 1.0),
        "inf": np.where(np.arange(100) == 3, -np.inf, 1.0),
        "overflow": np.full(100, 1e200),
    }
    for name, g in bad_grads.items():
        with pytest.raises(quantrs.QuantError) as e:
            opt.step(w, g)
        if name == "nan":
            assert "index 17" in str(e.value)
    with pytest.raises(quantrs.DimensionMismatch):
        opt.step(w, np.ones(99))
    with pytest.raises(quantrs.DimensionMismatch):
        opt.step(np.ones(99), np.ones(99))
    with pytest.raises(quantrs.InvalidArgument, match="own gradient"):
        opt.step(w, w)
    with pytest.raises(quantrs.InvalidArgument):
        opt.step(w, w[::-1])  # a view of the master
    with pytest.raises(TypeError):
        opt.step(w.astype(np.float32), np.ones(100))
    with pytest.raises(ValueError):
        opt.step(np.ones(200)[::2], np.ones(100))  # non-contiguous master
    ro = w.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        opt.step(ro, np.ones(100))
    with pytest.raises(TypeError):
        opt.step(w, np.ones(100), rng="seed")
    gen = quantrs.Rng(3)
    with pytest.raises(quantrs.InvalidArgument):
        opt.step(w, bad_grads["nan"], rng=gen)
    assert gen.counter == 0  # a failed step does not consume randomness
    np.testing.assert_array_equal(w, w_before)
    _assert_same_state(_state(opt), state)
    opt.step(w, np.ones(100))  # still usable
    assert opt.step_count() == 2


def test_degenerate_calibration_is_transactional():
    # AdamW with weight decay 1 and lr 1 sends every weight to exactly 0.
    w = np.array([0.5, -0.25, 1.0])
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int8", lr=1.0, weight_decay=1.0))
    w_before, state = w.copy(), _state(opt)
    with pytest.raises(quantrs.InvalidState, match="all-zero"):
        opt.step(w, np.zeros(3))
    np.testing.assert_array_equal(w, w_before)
    _assert_same_state(_state(opt), state)


def test_bad_constructor_arguments():
    w = np.ones(4)
    with pytest.raises(TypeError):
        quantrs.QatOptimizer(np.ones(4, dtype=np.int64), "int8")
    with pytest.raises(TypeError):
        quantrs.QatOptimizer(np.ones(4, dtype=np.float16), "int8")
    with pytest.raises(TypeError):
        quantrs.QatOptimizer([1.0, 2.0], "int8")
    with pytest.raises(quantrs.InvalidArgument, match="index 1"):
        quantrs.QatOptimizer(np.array([1.0, np.nan]), "int8")
    with pytest.raises(quantrs.InvalidArgument, match="target"):
        quantrs.QatConfig("int3")
    with pytest.raises(quantrs.InvalidArgument, match="beta1"):
        quantrs.QatConfig("int8", beta1=1.0)
    with pytest.raises(quantrs.InvalidArgument, match="lr"):
        quantrs.QatConfig("int8", lr=float("nan"))
    with pytest.raises(quantrs.InvalidArgument, match="affine"):
        quantrs.QatConfig("fp8_e4m3", scheme="affine")
    with pytest.raises(TypeError, match="scheme"):
        quantrs.QatConfig("int8", scheme=3)
    with pytest.raises(TypeError, match="config"):
        quantrs.QatOptimizer(w, 3)


# --- config, rng, pickling ----------------------------------------------------


def test_config_signature_shows_defaults():
    import inspect

    sig = inspect.signature(quantrs.QatConfig)
    assert sig.parameters["scheme"].default == "symmetric"
    assert sig.parameters["rounding"].default == "nearest"
    assert sig.parameters["weight_decay"].default == 0.0


def test_config_enums_strings_repr_pickle():
    c = quantrs.QatConfig(
        quantrs.QuantTarget.FP8_E5M2, rounding=quantrs.RoundingMode.STOCHASTIC, lr=0.01
    )
    assert c.target == quantrs.QuantTarget.FP8_E5M2 and c.target.value == "fp8_e5m2"
    assert c.scheme == quantrs.QuantScheme.SYMMETRIC and c.rounding.value == "stochastic"
    assert c == quantrs.QatConfig("FP8_E5M2", "symmetric", "stochastic", lr=0.01)
    assert eval(repr(c), {"QatConfig": quantrs.QatConfig}) == c
    assert pickle.loads(pickle.dumps(c)) == c
    assert quantrs.QatConfig("int8").lr == 1e-3


def test_rng_seeding_and_pickle():
    r = quantrs.Rng(5)
    a = r.next_u64()
    r2 = pickle.loads(pickle.dumps(r))
    assert r2 == r and r2.next_u64() == r.next_u64()
    assert quantrs.Rng(5).next_u64() == a
    assert quantrs.Rng(-1).seed == 2**64 - 1
    u = quantrs.Rng(0).random(10_000)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    assert quantrs.Rng().seed != quantrs.Rng().seed


def test_stochastic_optimizer_seeded_is_reproducible():
    def run(rng):
        w = np.linspace(-1, 1, 5000)
        opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int4", rounding="stochastic"), rng=rng)
        for _ in range(3):
            opt.step(w, np.sin(w))
        return opt.quantized_weights.copy()

    np.testing.assert_array_equal(run(7), run(7))
    np.testing.assert_array_equal(run(quantrs.Rng(7)), run(quantrs.Rng(7)))
    assert not np.array_equal(run(7), run(8))
    assert not np.array_equal(run(None), run(None))


def test_step_rng_override():
    w1 = np.linspace(-1, 1, 3000)
    w2 = w1.copy()
    c = quantrs.QatConfig("int8", rounding="stochastic")
    a = quantrs.QatOptimizer(w1, c, rng=1)
    b = quantrs.QatOptimizer(w2, c, rng=2)
    a.step(w1, np.ones(3000), rng=99)
    b.step(w2, np.ones(3000), rng=99)
    np.testing.assert_array_equal(a.quantized_weights, b.quantized_weights)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pickle_and_copy_continue_identically(dtype):
    rng = np.random.default_rng(9)
    w = rng.standard_normal(300).astype(dtype)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int4", "affine", "stochastic"), rng=4)
    opt.step(w, rng.standard_normal(300).astype(dtype))
    clones = [pickle.loads(pickle.dumps(opt)), copy.copy(opt), copy.deepcopy(opt)]
    g = rng.standard_normal(300).astype(dtype)
    w_ref = w.copy()
    opt.step(w_ref, g)
    for c in clones:
        assert not np.shares_memory(c.quantized_weights, opt.quantized_weights)
        wc = w.copy()
        c.step(wc, g)
        np.testing.assert_array_equal(wc, w_ref)
        _assert_same_state(_state(c), _state(opt))
    assert repr(opt).startswith("QatOptimizer(master=<float") and "shape (300,)>" in repr(opt)
    assert "rng=4)" in repr(opt) and "step_count=2" in repr(opt)


def test_corrupt_bytes_are_rejected():
    w = np.ones(10) * np.arange(10)
    opt = quantrs.QatOptimizer(w, "int8")
    data = opt.to_bytes()
    for bad in [b"", data[:-1], data[:20], b"XXXX" + data[4:]]:
        with pytest.raises(quantrs.SerializationError):
            quantrs.QatOptimizer.from_bytes(bad, (10,))
    flipped = bytearray(data)
    flipped[40] ^= 1
    with pytest.raises(quantrs.SerializationError, match="CRC"):
        quantrs.QatOptimizer.from_bytes(bytes(flipped), (10,))
    with pytest.raises(quantrs.SerializationError, match="shape"):
        quantrs.QatOptimizer.from_bytes(data, (11,))


# --- property tests -----------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_special = st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 2.2e-308, 1.5, -2.5, 1e300])
_floats = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), _special)


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=40), elements=_floats),
    target=st.sampled_from(INT_TARGETS),
    scheme=st.sampled_from(["symmetric", "affine"]),
)
def test_fake_quant_property(x, target, scheme):
    try:
        expected = ref.fake_quant(x, target, scheme)
    except ValueError:  # all zero, or a range so small the scale underflows
        with pytest.raises(quantrs.InvalidState, match="degenerate"):
            qat.fake_quant(x, target, scheme)
        return
    out = qat.fake_quant(x, target, scheme)
    assert out.shape == x.shape
    np.testing.assert_array_equal(out.view(np.uint64), expected.view(np.uint64))


@pytest.mark.kernel
@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        np.float64,
        hnp.array_shapes(max_dims=1, max_side=200),
        elements=st.one_of(st.floats(width=64), _special),
    ),
    target=st.sampled_from(["fp8_e4m3", "fp8_e5m2"]),
)
def test_fp8_property(x, target):
    out = qat.fake_quant(x, target)
    np.testing.assert_array_equal(out, ref.fp8_round(x, target))


def test_gil_released_during_step_and_access_is_guarded():
    # While a worker thread is inside `step` (GIL released), this thread keeps
    # running Python: reading the view then meets the optimizer mutably
    # borrowed and gets a clean RuntimeError, never a torn read or a panic.
    import threading

    w = np.random.default_rng(10).standard_normal(1 << 22)
    g = np.ones_like(w)
    opt = quantrs.QatOptimizer(w, "int8")
    errors, done = [], threading.Event()

    def worker():
        for _ in range(5):
            opt.step(w, g)
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    while not done.is_set():
        try:
            v = opt.quantized_weights  # a view, or a clean error while a step runs
            assert v.shape == w.shape
        except RuntimeError as e:
            errors.append(e)
    t.join()
    assert opt.step_count() == 5
    assert all("borrow" in str(e) for e in errors)
    assert errors, "the main thread never ran during a step: was the GIL held?"
