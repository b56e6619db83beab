"""QuantizedWeight.matvec / matmul with activations="int8" (docs/int4.md,
"Int8 activations") against a pure-NumPy reference of the same formula."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_gil_released, rand
from hypothesis import given
from hypothesis import strategies as st

from quantrs import QuantizedWeight
from quantrs.reference.int4 import unpack_int4

pytestmark = pytest.mark.kernel

F32 = np.float32


def quantize_x(x: np.ndarray, gs: int, in_padded: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group of `gs` inputs: d = absmax / 127 (float32), codes
    clip(rint(x / d), -127, 127) (ties to even); a group whose d would be
    subnormal is all zero with d = 0. Returns codes [b, in_padded] and d
    [b, groups]."""
    b, k = x.shape
    xp = np.zeros((b, in_padded), F32)
    xp[:, :k] = x
    g = xp.reshape(b, -1, gs)
    d = (np.abs(g).max(axis=2) / F32(127)).astype(F32)
    tiny = d < np.finfo(F32).tiny
    safe = np.where(tiny, F32(1), d).astype(F32)
    q = np.clip(np.rint(g / safe[..., None]), -127, 127).astype(np.int8)
    q[tiny] = 0
    return q.reshape(b, in_padded), np.where(tiny, F32(0), d).astype(F32)


def integer_sums(qw: QuantizedWeight, x: np.ndarray):
    """acc[b, g, o] = sum_{i in g} q_w[i, o] * q_x[b, i] (exact, int64), the
    weight scales [g, o] and the activation scales d [b, g]."""
    gs, n, groups = qw.group_size, qw.out_feat, qw.num_groups
    codes = unpack_int4(qw.data, n).astype(np.int64).reshape(groups, gs, n)
    q, d = quantize_x(x, gs, groups * gs)
    acc = np.einsum("bgi,gio->bgo", q.astype(np.int64).reshape(len(x), groups, gs), codes)
    return acc, qw.scales.reshape(groups, n), d


def formula_f32(qw: QuantizedWeight, x: np.ndarray) -> np.ndarray:
    """The kernels' float32 epilogue, operation for operation: per group in
    order, y = y + float32(acc) * (scale_w * d)."""
    acc, sw, d = integer_sums(qw, x)
    y = np.zeros((len(x), qw.out_feat), F32)
    for g in range(qw.num_groups):
        y = y + acc[:, g, :].astype(F32) * (sw[g][None, :] * d[:, g, None])
    return y


def assert_matches_formula_f64(qw, x, y):
    """Within float32 rounding of the same formula evaluated in float64 (for
    calls large enough that the driver adds partial sums in blocks)."""
    acc, sw, d = integer_sums(qw, x)
    terms = acc * (sw.astype(np.float64)[None] * d.astype(np.float64)[:, :, None])
    y64 = terms.sum(axis=1)
    tol = (qw.num_groups + 2) * 2.0**-23 * np.abs(terms).sum(axis=1) + 1e-30
    err = np.abs(y.astype(np.float64) - y64)
    assert np.all(err <= tol), f"max excess {np.max(err - tol)}"


def assert_within_bound(qw, x, y):
    """|y - x @ W| <= sum_g d[g] / 2 * sum_{i in g} |w_io| + 1e-5 * sum_i |x_i w_io|
    + 1e-6, against float64 (W the dequantized weight)."""
    w = qw.dequantize().astype(np.float64)
    k, gs = qw.in_feat, qw.group_size
    _, d = quantize_x(x, gs, qw.num_groups * gs)
    x64 = x.astype(np.float64)
    exact = x64 @ w
    d_rows = np.repeat(d.astype(np.float64), gs, axis=1)[:, :k]  # d of each input's group
    bound = (d_rows / 2) @ np.abs(w) + 1e-5 * (np.abs(x64) @ np.abs(w)) + 1e-6
    err = np.abs(y.astype(np.float64) - exact)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


# --- the formula, bit for bit ----------------------------------------------------


@given(
    k=st.integers(1, 80),
    n=st.integers(1, 70),
    gs_half=st.integers(1, 40),
    batch=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_bit_exact_against_numpy_formula(k, n, gs_half, batch, seed):
    """Group sizes the AVX2 kernel takes (multiples of 16) and ones it leaves
    to the scalar kernel, column tails, padded inputs: one formula, one
    result."""
    qw = QuantizedWeight.quantize(rand((k, n), seed), group_size=2 * gs_half, method="rtn")
    x = rand((batch, k), seed + 1)
    want = formula_f32(qw, x)
    y = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    assert_within_bound(qw, x, y)


@pytest.mark.parametrize("gs", [16, 32, 64, 8, 6])
def test_matvec_equals_matmul_row_and_formula(gs):
    qw = QuantizedWeight.quantize(rand((96, 77), 3), group_size=gs, method="rtn")
    x = rand((96,), 4)
    y = qw.matvec(x, activations="int8")
    assert y.shape == (77,) and y.dtype == np.float32
    np.testing.assert_array_equal(y, formula_f32(qw, x[None])[0])
    np.testing.assert_array_equal(y, qw.matmul(x[None], activations="int8")[0])


@given(
    k=st.integers(1, 700),
    n=st.integers(1, 70),
    gs_quarter=st.sampled_from([1, 2, 4, 8, 10, 16, 32]),
    batch=st.integers(5, 40),
    seed=st.integers(0, 2**16),
)
def test_gemm_bit_exact_against_numpy_formula(k, n, gs_quarter, batch, seed):
    """From 5 rows (the blocked GEMM, for group sizes that are multiples of
    4; several blocks of groups past 512 inputs): the same formula, bit for
    bit. Small enough to run in one piece, in group order from y = 0."""
    qw = QuantizedWeight.quantize(rand((k, n), seed), group_size=4 * gs_quarter, method="rtn")
    x = rand((batch, k), seed + 1)
    y = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(y.view(np.uint32), formula_f32(qw, x).view(np.uint32))


@pytest.mark.parametrize(("batch", "gs"), [(128, 32), (130, 64), (33, 16), (129, 128), (40, 6)])
def test_large_batches_bit_exact_against_numpy_formula(batch, gs):
    """Large batches (pieces of rows times column chunks, each summing every
    group in order) equal the formula bit for bit, and stay in the bound."""
    qw = QuantizedWeight.quantize(rand((640, 300), 11), group_size=gs, method="rtn")
    x = rand((batch, 640), 12 + batch)
    y = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(y.view(np.uint32), formula_f32(qw, x).view(np.uint32))
    assert_within_bound(qw, x, y)


@pytest.mark.parametrize(("batch", "gs"), [(16, 128), (77, 128), (64, 64), (512, 128)])
def test_prefill_batches_with_padded_groups_bit_exact(batch, gs):
    """Prefill-sized batches on SmolLM2's 576 inputs (g128 pads them to 640;
    on AMX-INT8 CPUs these calls run the tile GEMM) equal the formula bit
    for bit."""
    qw = QuantizedWeight.quantize(rand((576, 200), 21), group_size=gs, method="rtn")
    x = rand((batch, 576), 22 + batch)
    y = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(y.view(np.uint32), formula_f32(qw, x).view(np.uint32))


@pytest.mark.parametrize("batch", [1, 3, 4, 5, 17, 40, 128])
def test_large_calls_against_formula_and_bound(batch):
    """Above the parallel threshold (split in blocks of groups up to 4 rows,
    column chunks and row blocks beyond)."""
    qw = QuantizedWeight.quantize(rand((1024, 1000), 5), method="rtn")
    x = rand((batch, 1024), 6 + batch)
    y = qw.matmul(x, activations="int8")
    assert_matches_formula_f64(qw, x, y)
    assert_within_bound(qw, x, y)
    # Deterministic call to call.
    np.testing.assert_array_equal(y, qw.matmul(x, activations="int8"))


def test_bound_holds_on_mixed_magnitudes_and_differs_from_float32():
    """Each group has its own scale: tiny, huge and ordinary groups in one row."""
    qw = QuantizedWeight.quantize(rand((256, 48), 7), method="rtn")
    x = rand((3, 256), 8) * np.repeat(F32([1e-20, 1.0, 1e20, 3e-3]), 64)[None, :].astype(F32)
    x = x.astype(F32)
    y = qw.matmul(x, activations="int8")
    assert_within_bound(qw, x, y)
    np.testing.assert_array_equal(y, formula_f32(qw, x))
    assert not np.array_equal(y, qw.matmul(x)), "int8 activations left no trace"


def test_default_and_explicit_float32_are_unchanged():
    qw = QuantizedWeight.quantize(rand((128, 40), 9), method="rtn")
    x = rand((5, 128), 10)
    np.testing.assert_array_equal(qw.matmul(x), qw.matmul(x, activations="float32"))
    np.testing.assert_array_equal(qw.matvec(x[0]), qw.matvec(x[0], activations="float32"))


def test_out_and_empty_batch():
    qw = QuantizedWeight.quantize(rand((64, 33), 11), method="rtn")
    x = rand((4, 64), 12)
    out = np.full((4, 33), np.nan, F32)
    r = qw.matmul(x, out=out, activations="int8")
    assert r is out
    np.testing.assert_array_equal(out, qw.matmul(x, activations="int8"))
    ov = np.full(33, np.nan, F32)
    qw.matvec(x[1], out=ov, activations="int8")
    np.testing.assert_array_equal(ov, out[1])
    assert qw.matmul(np.zeros((0, 64), F32), activations="int8").shape == (0, 33)
    with pytest.raises(ValueError, match="x"):
        qw.matmul(rand((2, 63), 1), activations="int8")
    with pytest.raises(ValueError, match="x"):
        qw.matvec(rand((2, 64), 1), activations="int8")


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_x_is_a_value_error(bad):
    qw = QuantizedWeight.quantize(rand((64, 8), 13), method="rtn")
    x = rand((2, 64), 14)
    x[1, 5] = bad
    with pytest.raises(ValueError, match=r"x: non-finite value .* at index \[1, 5\]"):
        qw.matmul(x, activations="int8")
    with pytest.raises(ValueError, match="non-finite"):
        qw.matvec(x[1], activations="int8")
    # The float32 path propagates it instead.
    assert not np.all(np.isfinite(qw.matmul(x)[1]))


@pytest.mark.parametrize("value", ["fp16", "INT8", "", "float64"])
def test_bad_activations_value_names_the_argument(value):
    qw = QuantizedWeight.quantize(rand((32, 8), 15), method="rtn")
    with pytest.raises(ValueError, match=r"activations: expected 'float32' or 'int8'"):
        qw.matvec(rand((32,), 1), activations=value)
    with pytest.raises(ValueError, match="activations"):
        qw.matmul(rand((2, 32), 1), activations=value)


def test_activations_is_keyword_only_and_a_string():
    qw = QuantizedWeight.quantize(rand((32, 8), 16), method="rtn")
    with pytest.raises(TypeError):
        qw.matvec(rand((32,), 1), None, "int8")
    with pytest.raises(TypeError):
        qw.matvec(rand((32,), 1), activations=8)


def test_gil_released_during_int8_kernel():
    qw = QuantizedWeight.quantize(rand((4096, 2048), 17), method="rtn")
    x = rand((384, 4096), 18)
    assert_gil_released(lambda: qw.matmul(x, activations="int8"))
