"""GPTQ (``quantrs.gptq``, docs/int4.md "GPTQ") against an independent NumPy
implementation of the published algorithm (Frantar et al. 2022, Algorithm 1 without the
lazy batches), the files it writes, and its bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs

pytestmark = pytest.mark.kernel


def correlated_inputs(n: int, k: int, seed: int = 0) -> np.ndarray:
    """``[n, k]`` inputs with strongly correlated features and uneven scales (where GPTQ's
    error feedback pays off, unlike white noise)."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) * 0.3 + np.eye(k)
    x = rng.standard_normal((n, k // 4)) @ rng.standard_normal((k // 4, k)) + 0.3 * (
        rng.standard_normal((n, k)) @ mix
    )
    return (x * rng.uniform(0.2, 3.0, k)).astype(np.float32)


def layer(out: int, k: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((out, k)).astype(np.float32)


def sym_rtn(col_block: np.ndarray) -> np.ndarray:
    """docs/int4.md "rtn": scale = max(absmax / 7, 1e-8) per output over the group."""
    s = (np.abs(col_block).max(axis=1) / np.float32(7)).astype(np.float32)
    return np.maximum(s, np.float32(1e-8))


def sym_q(col: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = np.clip(np.round(col.astype(np.float32) / s), -8, 7)
    return q, (q * s).astype(np.float32)


def asym_rtn(col_block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """docs/int4.md int4_asym "rtn": m = min, d = (max - min) / 15, both rounded to half."""
    lo = col_block.astype(np.float32).min(axis=1)
    hi = col_block.astype(np.float32).max(axis=1)
    d = ((hi - lo) / np.float32(15)).astype(np.float16).astype(np.float32)
    return d, lo.astype(np.float16).astype(np.float32)


def asym_q(col: np.ndarray, dm) -> tuple[np.ndarray, np.ndarray]:
    d, m = dm
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    t = (col.astype(np.float32) - m) * inv
    q = np.clip(np.sign(t) * np.floor(np.abs(t) + np.float32(0.5)), 0, 15)
    return q, (d * q.astype(np.float32) + m).astype(np.float32)


def reference_gptq(w, h, gs, choose, quant, damp=0.01):
    """Algorithm 1 of the paper, one column at a time (no lazy batches), the group's
    parameters chosen from the updated weights at the group's first column."""
    w = w.astype(np.float64).copy()
    h = h.astype(np.float64).copy()
    h += damp * np.mean(np.diag(h)) * np.eye(len(h))
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    codes = np.zeros(w.shape)
    params = None
    for j in range(w.shape[1]):
        if j % gs == 0:
            params = choose(w[:, j : j + gs])
        q, deq = quant(w[:, j], params)
        codes[:, j] = q
        err = (w[:, j] - deq) / u[j, j]
        w[:, j + 1 :] -= np.outer(err, u[j, j + 1 :])
    return codes


def sym_codes(qw: quantrs.QuantizedWeight) -> np.ndarray:
    """The codes [out, in] of a QuantizedWeight, unpacked from its nibbles."""
    d = np.array(qw.data).reshape(-1, qw.out_feat)
    q = np.stack([d & 0x0F, d >> 4], axis=1).reshape(-1, qw.out_feat).astype(np.int8)
    q = np.where(q > 7, q - 16, q)
    return q[: qw.in_feat].T


@pytest.mark.parametrize("gs", [32, 64])
def test_sym_rtn_grid_equals_the_reference(gs):
    x, w = correlated_inputs(512, 192), layer(24, 192)
    h = 2 * x.astype(np.float64).T @ x
    qw = quantrs.gptq(w, h, format="int4", group_size=gs, grid="rtn", refine=0)
    want = reference_gptq(w, h, gs, sym_rtn, sym_q)
    assert np.array_equal(sym_codes(qw), want)
    assert np.array(qw.scales).shape == (192 // gs * 24,)


@pytest.mark.parametrize("gs", [32, 64])
def test_asym_rtn_grid_equals_the_reference(gs):
    x, w = correlated_inputs(512, 192), layer(24, 192)
    h = 2 * x.astype(np.float64).T @ x
    qa = quantrs.gptq(w, h, format="int4_asym", group_size=gs, grid="rtn", refine=0)
    want = reference_gptq(w, h, gs, asym_rtn, asym_q)
    assert np.array_equal(np.array(qa.codes()), want)


def output_error(x, w, deq_out_in) -> float:
    return float(np.linalg.norm(x @ w.T - x @ deq_out_in.T))


@pytest.mark.parametrize("grid", ["rtn", "search"])
def test_output_error_below_round_to_nearest(grid):
    x, w = correlated_inputs(1024, 256), layer(32, 256)
    h = 2 * x.astype(np.float64).T @ x
    imp = (x.astype(np.float64) ** 2).mean(0).astype(np.float32)
    sym = quantrs.gptq(w, h, format="int4", group_size=64, grid=grid).dequantize().T
    plain = quantrs.QuantizedWeight.quantize(w.T.copy(), group_size=64, method=grid, importance=imp)
    assert output_error(x, w, sym) < 0.8 * output_error(x, w, plain.dequantize().T)
    asym = quantrs.gptq(w, h, format="int4_asym", group_size=64, grid=grid).dequantize()
    plain_a = quantrs.Int4AsymWeight.quantize(w, group_size=64, method=grid, importance=imp)
    assert output_error(x, w, asym) < 0.8 * output_error(x, w, plain_a.dequantize())


def test_act_order_static_groups_keep_the_original_parameters():
    x, w = correlated_inputs(512, 128), layer(16, 128)
    h = 2 * x.astype(np.float64).T @ x
    qw = quantrs.gptq(w, h, format="int4", group_size=32, grid="rtn", act_order=True, refine=0)
    rtn = quantrs.QuantizedWeight.quantize(w.T.copy(), group_size=32, method="rtn")
    assert np.array_equal(np.array(qw.scales), np.array(rtn.scales))
    plain = output_error(x, w, rtn.dequantize().T)
    assert output_error(x, w, qw.dequantize().T) < plain


def test_files_are_the_formats_own(tmp_path):
    """What gptq writes dequantizes as the formats' references say, and round-trips."""
    x, w = correlated_inputs(256, 96), layer(8, 96)
    h = 2 * x.astype(np.float64).T @ x
    qw = quantrs.gptq(w, h, format="int4", group_size=64)  # 96 inputs: one padded group
    codes = sym_codes(qw).T.astype(np.float32)
    s = np.array(qw.scales).reshape(qw.num_groups, qw.out_feat)
    want = codes * np.repeat(s, 64, axis=0)[:96]
    assert np.array_equal(qw.dequantize(), want)
    qw.save(tmp_path / "w.safetensors")
    assert np.array_equal(
        quantrs.QuantizedWeight.load(tmp_path / "w.safetensors").dequantize(), want
    )
    qa = quantrs.gptq(w, h, format="int4_asym", group_size=64)  # groups of 64 and 32
    q = np.array(qa.codes()).astype(np.float32)
    dm = np.array(qa.scales())
    d = np.repeat(dm[:, :, 0], 64, axis=1)[:, :96]
    m = np.repeat(dm[:, :, 1], 64, axis=1)[:, :96]
    assert np.array_equal(qa.dequantize(), (d * q + m).astype(np.float32))
    again = quantrs.Int4AsymWeight.from_parts(qa.codes(), qa.scales(), group_size=64)
    assert np.array_equal(again.dequantize(), qa.dequantize())


def test_from_parts_refuses_bad_parts():
    w = layer(4, 64)
    qa = quantrs.Int4AsymWeight.quantize(w)
    codes, scales = np.array(qa.codes()), np.array(qa.scales())
    bad = codes.copy()
    bad[1, 3] = 16
    with pytest.raises(quantrs.InvalidArgument, match=r"codes\[1, 3\] is 16"):
        quantrs.Int4AsymWeight.from_parts(bad, scales)
    off = scales.copy()
    off[0, 1, 0] = 0.1  # not a half
    with pytest.raises(quantrs.InvalidArgument, match="scales"):
        quantrs.Int4AsymWeight.from_parts(codes, off)
    with pytest.raises(quantrs.QuantError, match="scales"):
        quantrs.Int4AsymWeight.from_parts(codes, scales[:, :1])
    with pytest.raises(quantrs.QuantError, match="group_size"):
        quantrs.Int4AsymWeight.from_parts(codes, scales, group_size=48)


def test_bad_inputs_name_the_argument():
    w = layer(8, 64)
    h = np.eye(64)
    with pytest.raises(quantrs.InvalidArgument, match="hessian: expected shape"):
        quantrs.gptq(w, np.eye(32))
    nan_h = h.copy()
    nan_h[2, 5] = np.nan
    with pytest.raises(quantrs.InvalidArgument, match=r"hessian\[2, 5\] is nan"):
        quantrs.gptq(w, nan_h)
    with pytest.raises(quantrs.InvalidArgument, match="hessian: diagonal"):
        quantrs.gptq(w, -h)
    bad_w = w.copy()
    bad_w[1, 2] = np.inf
    with pytest.raises(quantrs.InvalidArgument, match=r"w\[1, 2\] is inf"):
        quantrs.gptq(bad_w, h)
    with pytest.raises(quantrs.InvalidArgument, match="format"):
        quantrs.gptq(w, h, format="q4_k")
    with pytest.raises(quantrs.InvalidArgument, match="method"):
        quantrs.gptq(w, h, grid="best")
    with pytest.raises(quantrs.InvalidArgument, match="damp"):
        quantrs.gptq(w, h, damp=0.0)
    with pytest.raises(quantrs.InvalidArgument, match="w: expected a non-empty 2-D"):
        quantrs.gptq(w[0], h)
    with pytest.raises(TypeError, match="w: expected a 2-D float array"):
        quantrs.gptq("weights", h)
