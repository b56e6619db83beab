"""``GgufWeight.quantize``: float32 ``[out, in]`` to ggml blocks with ggml's quantizers.

The legacy types against ``gguf.quants.quantize`` (ggml's reference quantizers in NumPy)
byte for byte; every type's bytes decoded by ``gguf.quants.dequantize`` (the independent
decoder) equal to our ``dequantize()`` bit for bit and within float64 error bounds;
importance moves the error toward the heavily weighted inputs; ``save_gguf`` round trips
every type through the ``gguf`` package's reader; bad input raises naming the argument.
Byte equality with llama.cpp itself is ``benches/check_gguf_quantize.py``."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
from quantrs import GgufWeight

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
K_QUANTS = ("q4_k", "q5_k", "q6_k")
BLOCK = {**{t: 32 for t in LEGACY}, **{t: 256 for t in K_QUANTS}}
# code steps a block's range is split into (the error bound below is half a step,
# a whole one for the clamped top code of the symmetric types)
LEVELS = {"q4_0": 7.5, "q5_0": 15.5, "q8_0": 127, "q4_1": 15, "q5_1": 31}


def qtype(name: str):
    return gguf.GGMLQuantizationType[name.upper()]


def matrix(rows: int, cols: int, seed: int) -> np.ndarray:
    """Normal rows, then adversarial ones: all zeros, one huge value, ties on a grid,
    a negative maximum, a constant, all positive, tiny values."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows + 7, cols)).astype(np.float32)
    w[rows] = 0
    w[rows + 1, cols // 3] = 3e4
    w[rows + 2] = np.repeat(rng.integers(-8, 9, cols // 4), 4) * 0.125
    w[rows + 3] = -np.abs(w[rows + 3])
    w[rows + 3, 5] = -50.0
    w[rows + 4] = 0.3
    w[rows + 5] = np.abs(w[rows + 5])
    w[rows + 6] *= 1e-6
    return w


@pytest.mark.parametrize("name", LEGACY)
@pytest.mark.parametrize("shape", [(1, 32), (5, 96), (17, 256), (3, 2048)])
def test_legacy_types_equal_gguf_quants_byte_for_byte(name, shape):
    w = matrix(*shape, seed=shape[0] * 1000 + shape[1])
    ours = GgufWeight.quantize(w, name)
    ref = quants.quantize(w, qtype(name))
    np.testing.assert_array_equal(np.asarray(ours.to_bytes()).reshape(ref.shape), ref)
    assert ours.type == name and ours.shape == w.shape


@pytest.mark.parametrize("name", LEGACY + K_QUANTS)
@pytest.mark.parametrize("with_importance", [False, True])
def test_gguf_decodes_our_bytes_to_our_dequantize(name, with_importance):
    w = matrix(9, 512, seed=3)
    imp = np.random.default_rng(4).uniform(0, 2, 512).astype(np.float32)
    g = GgufWeight.quantize(w, name, importance=imp if with_importance else None)
    blocks = np.asarray(g.to_bytes()).reshape(w.shape[0], -1)
    ref = quants.dequantize(blocks, qtype(name))
    ours = g.dequantize()
    assert ours.dtype == np.float32 and np.isfinite(ours).all()
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_error_within_half_a_step_of_float64(name):
    w = matrix(20, 256, seed=5).astype(np.float64)
    deq = GgufWeight.quantize(w.astype(np.float32), name).dequantize().astype(np.float64)
    blocks = w.reshape(-1, 32)
    if name in ("q4_1", "q5_1"):
        span = blocks.max(1) - blocks.min(1)
    else:
        span = np.abs(blocks).max(1) * 2
    # half a step (a whole one at the symmetric types' clamped top code), plus the F16
    # rounding of the step and minimum (relative 2^-11 of the block's magnitudes;
    # absolute 2^-25 per code step where they are subnormal halves)
    step = span / LEVELS[name]
    top = {"q4_0": 8, "q5_0": 16, "q8_0": 127, "q4_1": 15, "q5_1": 31}[name]
    halves = (span + np.abs(blocks).max(1)) * 2.0**-10 + (top + 2) * 2.0**-25
    bound = (0.5 if name in ("q4_1", "q5_1") else 1.0) * step + halves
    err = np.abs(blocks - deq.reshape(-1, 32)).max(1)
    assert (err <= bound).all(), (err / np.maximum(bound, 1e-30)).max()


def _k_rtn(w: np.ndarray, name: str) -> np.ndarray:
    """A plain round to nearest of the same super-block structure in float64: per
    sub-block its range (widened to 0) on the codes, the 6-bit scales rounded against
    the largest (no search)."""
    nmax = {"q4_k": 15, "q5_k": 31}[name]
    x = w.astype(np.float64).reshape(-1, 8, 32)
    lo = np.minimum(x.min(-1), 0)
    d = (x.max(-1) - lo) / nmax
    big_d = d.max(-1, keepdims=True) / 63
    big_m = (-lo).max(-1, keepdims=True) / 63
    sc = np.round(d / np.where(big_d == 0, 1, big_d))
    mn = np.round(-lo / np.where(big_m == 0, 1, big_m))
    step, mins = (big_d * sc)[..., None], (big_m * mn)[..., None]
    q = np.clip(np.round((x + mins) / np.where(step == 0, 1, step)), 0, nmax)
    return (step * q - mins).reshape(w.shape)


@pytest.mark.parametrize("name", ["q4_k", "q5_k"])
def test_k_quants_beat_round_to_nearest(name):
    w = np.random.default_rng(6).standard_normal((64, 512)).astype(np.float32)
    ours = GgufWeight.quantize(w, name).dequantize().astype(np.float64)
    e_ours = np.square(ours - w).sum()
    e_rtn = np.square(_k_rtn(w, name) - w).sum()
    assert e_ours < e_rtn, (e_ours, e_rtn)
    # and far below the weight's own energy (4 / 5 bits: < 1 % / < 0.3 %)
    assert e_ours / np.square(w.astype(np.float64)).sum() < {"q4_k": 0.01, "q5_k": 0.003}[name]


def test_q6_k_relative_error():
    w = np.random.default_rng(7).standard_normal((64, 512)).astype(np.float32)
    ours = GgufWeight.quantize(w, "q6_k").dequantize().astype(np.float64)
    rel = np.square(ours - w).sum() / np.square(w.astype(np.float64)).sum()
    # 6-bit codes: about 2^-12 of the energy
    assert 1e-5 < rel < 1e-3, rel


@pytest.mark.parametrize("name", ["q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k"])
def test_importance_moves_the_error_to_the_weighted_inputs(name):
    cols = 512
    w = np.random.default_rng(8).standard_normal((32, cols)).astype(np.float32)
    heavy = (np.arange(cols) % 64) < 16
    imp = np.where(heavy, 100.0, 0.01).astype(np.float32)
    plain = GgufWeight.quantize(w, name).dequantize()
    weighted = GgufWeight.quantize(w, name, importance=imp).dequantize()
    err = lambda d: np.square((d - w)[:, heavy].astype(np.float64)).sum()  # noqa: E731
    # q6_k's importance only steers each sub-block's scale search (ggml re-rounds the
    # codes against the 8-bit scales): a smaller gain
    gain = 0.98 if name == "q6_k" else 0.9
    assert err(weighted) < gain * err(plain), (err(weighted), err(plain))


def test_q8_0_ignores_importance_as_ggml():
    w = matrix(4, 64, seed=9)
    a = GgufWeight.quantize(w, "q8_0").to_bytes()
    b = GgufWeight.quantize(w, "q8_0", importance=np.ones(64, np.float32)).to_bytes()
    np.testing.assert_array_equal(a, b)


def test_type_name_is_case_insensitive_and_matmul_runs():
    w = matrix(3, 256, seed=10)
    g = GgufWeight.quantize(w, "Q4_K")
    assert g.type == "q4_k" and g.nbytes == 10 * 144
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    ref = x.astype(np.float64) @ g.dequantize().astype(np.float64).T
    np.testing.assert_allclose(g.matmul(x), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", LEGACY + K_QUANTS)
def test_save_gguf_round_trips_every_type(tmp_path, name):
    from quantrs.formats import save_gguf

    w = matrix(4, 512, seed=11)
    g = GgufWeight.quantize(w, name)
    rows = save_gguf(tmp_path / "w.gguf", {"blk.0.ffn_down.weight": g})
    assert rows[0]["type"] == name.upper() and rows[0]["rel_err"] == 0.0
    (t,) = gguf.GGUFReader(str(tmp_path / "w.gguf")).tensors
    assert t.tensor_type == qtype(name)
    data = np.asarray(t.data).reshape(w.shape[0], -1)
    np.testing.assert_array_equal(data, np.asarray(g.to_bytes()).reshape(data.shape))
    np.testing.assert_array_equal(quants.dequantize(data, qtype(name)), g.dequantize())


def _bad(call, exc, *words):
    with pytest.raises(exc) as e:
        call()
    for word in words:
        assert word in str(e.value), str(e.value)


def test_bad_input_raises_naming_the_argument():
    w = matrix(2, 256, seed=12)
    _bad(lambda: GgufWeight.quantize(w, "q3_k"), quantrs.InvalidArgument, "type", "q4_k")
    _bad(lambda: GgufWeight.quantize(w, 4), TypeError, "type")
    _bad(lambda: GgufWeight.quantize(w[:, :128], "q6_k"), quantrs.DimensionMismatch, "w", "256")
    _bad(lambda: GgufWeight.quantize(w[:, :48], "q4_0"), quantrs.DimensionMismatch, "w", "32")
    _bad(lambda: GgufWeight.quantize(w[0], "q8_0"), quantrs.DimensionMismatch, "w", "2-D")
    _bad(lambda: GgufWeight.quantize(w[:0], "q8_0"), quantrs.DimensionMismatch, "w")
    nan = w.copy()
    nan[1, 7] = np.nan
    _bad(lambda: GgufWeight.quantize(nan, "q4_0"), quantrs.InvalidArgument, "[1, 7]", "finite")
    inf = w.copy()
    inf[0, 0] = np.inf
    _bad(lambda: GgufWeight.quantize(inf, "q5_k"), quantrs.InvalidArgument, "finite")
    imp = np.ones(256, np.float32)
    _bad(
        lambda: GgufWeight.quantize(w, "q4_k", importance=imp[:255]),
        quantrs.DimensionMismatch,
        "importance",
    )
    _bad(
        lambda: GgufWeight.quantize(w, "q4_k", importance=imp[None]),
        quantrs.DimensionMismatch,
        "importance",
    )
    neg = imp.copy()
    neg[9] = -1
    _bad(
        lambda: GgufWeight.quantize(w, "q6_k", importance=neg),
        quantrs.InvalidArgument,
        "importance[9]",
    )
    neg[9] = np.nan
    _bad(
        lambda: GgufWeight.quantize(w, "q4_1", importance=neg),
        quantrs.InvalidArgument,
        "importance[9]",
    )
    # every error is a QuantError; the input is untouched
    before = w.copy()
    with pytest.raises(quantrs.QuantError):
        GgufWeight.quantize(w, "q4_k", importance=neg)
    np.testing.assert_array_equal(w, before)
