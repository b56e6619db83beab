"""INT4 quantizer methods (docs/int4.md "Quantizers") against NumPy formulas, and the
calibration path of ``quantrs.torch.quantize_``."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import rand

import quantrs
from quantrs import QuantizedWeight

pytestmark = pytest.mark.kernel


def groups(w: np.ndarray, gs: int) -> np.ndarray:
    """[num_groups, gs, out] with zero padding rows (gs divides the padded length)."""
    k, n = w.shape
    pad = -k % gs
    return np.concatenate([w, np.zeros((pad, n), np.float32)]).reshape(-1, gs, n)


def dequant_at(w: np.ndarray, scales: np.ndarray, gs: int) -> np.ndarray:
    """NumPy's symmetric INT4 rounding at the given scales [num_groups, out]."""
    g = groups(w, gs)
    s = scales[:, None, :].astype(np.float32)
    q = np.clip(np.round(g / s), -8, 7)
    return (q * s).astype(np.float32).reshape(-1, w.shape[1])[: w.shape[0]]


def full_scales(w: np.ndarray, gs: int) -> np.ndarray:
    """Q4_0's rule: the signed value of largest magnitude over -8 (first one on ties)."""
    g = groups(w, gs)
    idx = np.abs(g).argmax(axis=1)
    mx = np.take_along_axis(g, idx[:, None, :], axis=1)[:, 0, :]
    s = (mx / np.float32(-8)).astype(np.float32)
    return np.where(np.abs(s) >= 1e-8, s, np.float32(1e-8))


def weighted_err(w, deq, imp) -> float:
    return float((imp[:, None] * (w.astype(np.float64) - deq) ** 2).sum())


@pytest.mark.parametrize(("k", "n", "gs"), [(64, 8, 32), (70, 5, 16), (576, 3, 128)])
def test_search_is_the_default_and_rtn_the_old_grid(k, n, gs):
    w = rand((k, n), seed=k)
    default = QuantizedWeight.quantize(w, group_size=gs)
    assert default == QuantizedWeight.quantize(w, group_size=gs, method="search")
    rtn = QuantizedWeight.quantize(w, group_size=gs, method="rtn")
    assert default != rtn
    np.testing.assert_array_equal(
        rtn.dequantize(), quantrs.reference.int4._fake_quantize_int4(w, gs)
    )
    ones = np.ones(k, np.float32)  # the default's error is never above rtn's
    assert weighted_err(w, default.dequantize(), ones) <= weighted_err(w, rtn.dequantize(), ones)


def test_a_file_of_the_old_default_grid_loads_unchanged(tmp_path):
    """A ``QuantizedWeight.save`` file as every release before "search" became the
    default wrote it (absmax / 7 codes and scales, from the NumPy reference, packed and
    written here by hand) loads to exactly those values."""
    from safetensors.numpy import save_file

    w, gs = rand((70, 6), seed=5), 16
    q, scales = quantrs.reference.quantize_int4(w, gs)  # [80, 6] int8, [5, 6] float32
    nib = (q & 0x0F).astype(np.uint8)
    data = nib[0::2] | (nib[1::2] << 4)
    meta = {"format": "quantrs.int4", "in_feat": "70", "out_feat": "6",
            "num_groups": "5", "group_size": "16"}  # fmt: skip
    path = tmp_path / "old.safetensors"
    save_file({"data": data, "scales": scales.astype(np.float32)}, str(path), metadata=meta)
    back = QuantizedWeight.load(str(path))
    np.testing.assert_array_equal(
        back.dequantize(), quantrs.reference.int4._fake_quantize_int4(w, gs)
    )
    assert back == QuantizedWeight.quantize(w, group_size=gs, method="rtn")


@pytest.mark.parametrize(("k", "n", "gs"), [(64, 8, 32), (70, 5, 16), (576, 3, 128)])
def test_full_matches_numpy(k, n, gs):
    w = rand((k, n), seed=k + 1)
    qw = QuantizedWeight.quantize(w, group_size=gs, method="full")
    want = full_scales(w, qw.group_size)
    np.testing.assert_array_equal(np.asarray(qw.scales).reshape(want.shape), want)
    np.testing.assert_array_equal(qw.dequantize(), dequant_at(w, want, qw.group_size))


def numpy_search(w: np.ndarray, gs: int, imp: np.ndarray) -> np.ndarray:
    """The search written out in NumPy: candidates absmax/7, max/-8 and the least-squares
    scale of the codes rounded at -(8 + 0.1 k) / max, k = -10..10; keep the least
    weighted error. Returns the dequantized weight."""
    g = groups(w, gs)
    ig = groups(imp[:, None].astype(np.float32), gs)[:, :, 0][:, :, None]
    idx = np.abs(g).argmax(axis=1)
    mx = np.take_along_axis(g, idx[:, None, :], axis=1)[:, 0, :].astype(np.float64)
    cands = [np.abs(mx) / 7, mx / -8]
    for k in range(-10, 11):
        inv = -(8 + 0.1 * k) / np.where(mx == 0, 1, mx)
        q = np.clip(np.round(g * inv[:, None, :]), -8, 7)
        cands.append((ig * g * q).sum(1) / np.maximum((ig * q * q).sum(1), 1e-30))
    best_err = np.full(mx.shape, np.inf)
    best = np.zeros(g.shape, np.float64)
    for s in cands:
        s = np.where(np.abs(s) >= 1e-8, s, 1e-8).astype(np.float32)[:, None, :]
        deq = np.clip(np.round(g / s), -8, 7) * s
        err = (ig * (g - deq) ** 2).sum(1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best = np.where(better[:, None, :], deq, best)
    return best.reshape(-1, w.shape[1])[: w.shape[0]]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(("k", "n", "gs"), [(64, 8, 32), (70, 5, 16), (576, 3, 128)])
def test_search_matches_numpy_error(k, n, gs, weighted):
    w = rand((k, n), seed=k + 2) * np.linspace(0.2, 3, k, dtype=np.float32)[:, None]
    imp = (rand(k, seed=k + 3) ** 2 + 0.01) if weighted else np.ones(k, np.float32)
    qw = QuantizedWeight.quantize(
        w, group_size=gs, method="search", importance=imp if weighted else None
    )
    ours = weighted_err(w, qw.dequantize(), imp)
    ref = weighted_err(w, numpy_search(w, qw.group_size, imp), imp)
    assert ours == pytest.approx(ref, rel=1e-4)
    for other in ("rtn", "full"):
        e = weighted_err(
            w, QuantizedWeight.quantize(w, group_size=gs, method=other).dequantize(), imp
        )
        assert ours <= e * (1 + 1e-6), other
    # The codes are the nearest ones at the stored scales (one format for every method).
    s = np.asarray(qw.scales).reshape(-1, n)
    np.testing.assert_array_equal(qw.dequantize(), dequant_at(w, s, qw.group_size))


def test_bad_inputs():
    w = rand((64, 4))
    with pytest.raises(quantrs.InvalidArgument, match="method"):
        QuantizedWeight.quantize(w, method="gptq")
    with pytest.raises(quantrs.DimensionMismatch, match="importance"):
        QuantizedWeight.quantize(w, method="search", importance=np.ones(63, np.float32))
    with pytest.raises(quantrs.DimensionMismatch, match="importance"):
        QuantizedWeight.quantize(w, method="search", importance=np.ones((64, 1), np.float32))
    for bad in (-1.0, np.nan, np.inf):
        imp = np.ones(64, np.float32)
        imp[5] = bad
        with pytest.raises(quantrs.InvalidArgument, match=r"importance\[5\]"):
            QuantizedWeight.quantize(w, method="search", importance=imp)
    with pytest.raises(TypeError, match="importance"):
        QuantizedWeight.quantize(w, method="search", importance="x")


def test_quantize_calibration_gives_the_importance():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    batches = [torch.randn(5, 64) * torch.linspace(0.1, 4, 64) for _ in range(3)]
    x = torch.cat(batches).double()
    with torch.no_grad():
        h = torch.relu(x @ model[0].weight.double().t() + model[0].bias.double())
    want = {"0": (x * x).mean(0).numpy(), "2": (h * h).mean(0).numpy()}
    imp = qt.collect_importance(model, batches, lambda m, n: True)
    assert sorted(imp) == ["0", "2"]
    for n in want:
        np.testing.assert_allclose(imp[n], want[n], rtol=1e-5)
    weights = {n: model[int(n)].weight.detach().t().contiguous().numpy() for n in want}
    qt.quantize_(model, "int4", quantizer="search", calibration=batches)
    for n in want:
        ref = QuantizedWeight.quantize(
            weights[n], group_size=32, method="search", importance=imp[n]
        )
        np.testing.assert_array_equal(
            model[int(n)].quantized_weight().dequantize(), ref.dequantize()
        )
    with pytest.raises(quantrs.InvalidArgument, match="quantizer|method"):
        qt.quantize_(torch.nn.Sequential(torch.nn.Linear(4, 4)), "int4", quantizer="nope")
    with pytest.raises(quantrs.InvalidArgument, match="calibration"):
        qt.quantize_(torch.nn.Sequential(torch.nn.Linear(4, 4)), "int4", calibration=[])
