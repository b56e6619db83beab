"""The asymmetric INT4 format (``quantrs.Int4AsymWeight``, registered as ``int4_asym``)
against NumPy: the min / max grid with IEEE half ``d`` and ``m`` (``np.float16``), the
decode ``d * q + m`` in float32, the search's weighted error against an independent NumPy
implementation of the same search, the forward against float64, the layer bytes."""

from __future__ import annotations

import numpy as np
import pytest
from _packed_modules import assert_first_layer_is_packed, only_first, two_layer_model

import quantrs

RNG = np.random.default_rng(5)


def weight(out: int, inp: int) -> np.ndarray:
    """Rows of both signs of minimum (row r shifted by 0.15 (r - out / 2))."""
    w = RNG.standard_normal((out, inp)).astype(np.float32) * 0.1
    return w + (np.arange(out, dtype=np.float32)[:, None] - out / 2) * np.float32(0.15)


def groups(a: np.ndarray, gs: int) -> list[np.ndarray]:
    """Column groups of ``gs`` (the last one shorter)."""
    return [a[:, g : g + gs] for g in range(0, a.shape[1], gs)]


def half(v) -> np.ndarray:
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def nearest_codes(x: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``clip(round_half_away((x - m) * (1 / d)), 0, 15)`` in float32 (0 where d == 0)."""
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    t = ((x - m) * inv).astype(np.float32)
    return np.clip(np.sign(t) * np.floor(np.abs(t) + np.float32(0.5)), 0, 15)


def decode(q: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    return (d * q.astype(np.float32)).astype(np.float32) + m


def wsse(x, q, d, m, imp) -> np.ndarray:
    """Per group row: sum imp * (x - (d q + m))^2 in float64."""
    e = x.astype(np.float64) - decode(q, d, m).astype(np.float64)
    return (imp * e * e).sum(axis=-1)


@pytest.mark.parametrize("gs", [32, 64, 128])
def test_rtn_is_min_max_on_half_scales(gs):
    w = weight(6, 576)
    qw = quantrs.Int4AsymWeight.quantize(w, group_size=gs, method="rtn")
    codes, scales = qw.codes(), qw.scales()
    ngroups = -(-576 // gs)
    assert scales.shape == (6, ngroups, 2)
    assert qw.nbytes == 6 * (288 + 4 * ngroups)
    for g, x in enumerate(groups(w, gs)):
        d = half((x.max(1) - x.min(1)) / np.float32(15))[:, None]
        m = half(x.min(1))[:, None]
        np.testing.assert_array_equal(scales[:, g, 0:1], d)
        np.testing.assert_array_equal(scales[:, g, 1:2], m)
        q = nearest_codes(x, d, m)
        np.testing.assert_array_equal(codes[:, g * gs : g * gs + x.shape[1]], q)
    assert set(np.unique(codes)) == set(range(16)), "every code is used"
    assert (scales[:, :, 1] < 0).any() and (scales[:, :, 1] > 0).any(), "both min signs"
    deq = qw.dequantize()
    d_full = np.repeat(scales[:, :, 0], gs, axis=1)[:, :576]
    m_full = np.repeat(scales[:, :, 1], gs, axis=1)[:, :576]
    np.testing.assert_array_equal(deq, decode(codes, d_full, m_full))


def numpy_search(x: np.ndarray, imp: np.ndarray) -> np.ndarray:
    """The search of docs/int4.md for groups ``x [n, g]``, written independently:
    trial steps (15 + 0.1 k) / (max - min), codes rounded at each, the weighted
    least-squares (d, m) for them rounded to half, nearest codes, the weighted error;
    the min / max pair competes; the winner is refined twice. Returns the best errors."""
    imp = np.broadcast_to(imp, x.shape)
    lo, hi = x.min(1, keepdims=True), x.max(1, keepdims=True)
    d0, m0 = half((hi - lo) / np.float32(15)), half(lo)
    best_q = nearest_codes(x, d0, m0)
    best = wsse(x, best_q, d0, m0, imp)

    def consider(q_trial):
        nonlocal best, best_q
        lq = q_trial.astype(np.float64)
        xs = x.astype(np.float64)
        sw, sl, sl2 = imp.sum(1), (imp * lq).sum(1), (imp * lq * lq).sum(1)
        sx, sxl = (imp * xs).sum(1), (imp * xs * lq).sum(1)
        det = sw * sl2 - sl * sl
        ok = det > 0
        safe = np.where(ok, det, 1.0)
        d = half(((sw * sxl - sx * sl) / safe).astype(np.float32))[:, None]
        m = half(((sl2 * sx - sl * sxl) / safe).astype(np.float32))[:, None]
        q = nearest_codes(x, d, m)
        e = np.where(ok, wsse(x, q, d, m, imp), np.inf)
        better = e < best
        best = np.where(better, e, best)
        best_q = np.where(better[:, None], q, best_q)

    span = np.where(hi > lo, hi - lo, np.float32(1))
    for k in range(-20, 21):
        iscale = (np.float32(15) + np.float32(0.1) * np.float32(k)) / span
        t = ((x - lo) * iscale).astype(np.float32)
        consider(np.clip(np.sign(t) * np.floor(np.abs(t) + np.float32(0.5)), 0, 15))
    for _ in range(2):
        consider(best_q)
    return best


@pytest.mark.parametrize("use_importance", [False, True])
@pytest.mark.parametrize("gs", [32, 64, 128])
def test_search_beats_rtn_and_matches_numpy(gs, use_importance):
    w = weight(16, 256)
    imp = RNG.uniform(0.0, 3.0, 256).astype(np.float32) if use_importance else None
    rtn = quantrs.Int4AsymWeight.quantize(w, group_size=gs, method="rtn", importance=imp)
    srch = quantrs.Int4AsymWeight.quantize(w, group_size=gs, method="search", importance=imp)
    imp_all = np.ones(256, np.float32) if imp is None else imp
    deq_r, deq_s = rtn.dequantize(), srch.dequantize()
    for g, (x, r, s) in enumerate(zip(groups(w, gs), groups(deq_r, gs), groups(deq_s, gs))):
        ig = imp_all[g * gs : g * gs + x.shape[1]].astype(np.float64)
        e_r = (ig * (x.astype(np.float64) - r) ** 2).sum(1)
        e_s = (ig * (x.astype(np.float64) - s) ** 2).sum(1)
        assert (e_s <= e_r * (1 + 1e-12)).all(), f"group {g}: search worse than rtn"
        ref = numpy_search(x, ig)
        np.testing.assert_allclose(e_s, ref, rtol=1e-9, atol=0)
    tot_r = ((w - deq_r).astype(np.float64) ** 2 * imp_all).sum()
    tot_s = ((w - deq_s).astype(np.float64) ** 2 * imp_all).sum()
    assert tot_s < 0.9 * tot_r


def test_forward_layer_and_bytes():
    w = weight(24, 576)
    bias = RNG.standard_normal(24).astype(np.float32)
    qw = quantrs.Int4AsymWeight.quantize(w, group_size=128)
    deq = qw.dequantize().astype(np.float64)
    sc = qw.scales().astype(np.float64)
    d_full = np.repeat(sc[:, :, 0], 128, axis=1)[:, :576]
    m_full = np.repeat(sc[:, :, 1], 128, axis=1)[:, :576]
    # The fused kernel's bound (docs/int4.md): (in + 3) eps sum (|d q| + |m|) |x|.
    mag_w = np.abs(d_full * qw.codes()) + np.abs(m_full)
    for rows in (1, 5, 40):
        x = RNG.standard_normal((rows, 576)).astype(np.float32)
        y = qw.matmul(x)
        ref = x.astype(np.float64) @ deq.T
        bound = 579 * np.finfo(np.float32).eps * (np.abs(x) @ mag_w.T)
        assert (np.abs(y - ref) <= bound).all()
    layer = qw.to_layer(bias)
    assert layer.format == "int4_asym"
    x = RNG.standard_normal((3, 576)).astype(np.float32)
    np.testing.assert_allclose(layer.forward(x), qw.matmul(x) + bias, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(layer.dequantize_w(), qw.dequantize())
    blob = layer.serialize()
    back = quantrs.QuantLinear.deserialize(blob)
    assert back.serialize() == blob
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(quantrs.SerializationError):
        quantrs.QuantLinear.deserialize(bytes(bad))
    # The generic constructor quantizes by min / max.
    rtn = quantrs.Int4AsymWeight.quantize(w, group_size=64, method="rtn")
    gen = quantrs.QuantLinear(w, "int4_asym", group_size=64)
    np.testing.assert_array_equal(gen.dequantize_w(), rtn.dequantize())


def test_bad_arguments_name_themselves():
    w = weight(2, 64)
    with pytest.raises(quantrs.QuantError, match="method"):
        quantrs.Int4AsymWeight.quantize(w, method="full")
    with pytest.raises(quantrs.QuantError, match="group_size"):
        quantrs.Int4AsymWeight.quantize(w, group_size=48)
    with pytest.raises(quantrs.QuantError, match="multiple of 32"):
        quantrs.Int4AsymWeight.quantize(w[:, :48].copy())
    with pytest.raises(quantrs.QuantError, match="importance"):
        quantrs.Int4AsymWeight.quantize(w, importance=np.ones(3, np.float32))
    with pytest.raises(quantrs.QuantError, match="importance"):
        quantrs.Int4AsymWeight.quantize(w, importance=-np.ones(64, np.float32))
    nan = w.copy()
    nan[1, 7] = np.nan
    with pytest.raises(quantrs.QuantError, match=r"w\[1, 7\] is NaN, expected a finite value"):
        quantrs.Int4AsymWeight.quantize(nan)
    with pytest.raises(quantrs.QuantError, match=r"w\[\d+, \d+\] is .*\|w\| <= 65504"):
        quantrs.Int4AsymWeight.quantize(w * 1e6)
    with pytest.raises(quantrs.QuantError, match="w"):
        quantrs.Int4AsymWeight.quantize(w.ravel())
    qw = quantrs.Int4AsymWeight.quantize(w)
    with pytest.raises(quantrs.QuantError, match="x"):
        qw.matmul(np.ones((2, 63), np.float32))
    with pytest.raises(quantrs.QuantError, match="bias"):
        qw.to_layer(np.ones(3, np.float32))


def test_quantize_routes_int4_asym_to_packed_modules():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    model, w0, calib, imp = two_layer_model(torch)
    qt.quantize_(model, "int4_asym", 32, only_first, quantizer="search", calibration=calib)
    ref = quantrs.Int4AsymWeight.quantize(w0, group_size=32, method="search", importance=imp)
    assert_first_layer_is_packed(torch, model, ref)
    with pytest.raises(quantrs.QuantError, match="method"):
        qt.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 8)), "int4_asym", quantizer="full")
