"""Prefill-sized calls whose work is cut into pieces for the pool (docs/int4.md, "How `matmul`
works" and "Int8 activations"): the range check of `x` and the int8 quantization of `x` run in
pieces from a size on; results are the same bits on one thread as on the pool, at batch sizes
around those sizes and the GEMM's task grid, with N short of a 32-column panel."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import rand
from test_int4_int8act import formula_f32

import quantrs
from quantrs import QuantizedWeight

pytestmark = pytest.mark.kernel

# 57 rows of 576 are the first batch whose int8 quantization runs in bands on the pool (2^15
# values), 228 rows the first whose range check runs in pieces (2^17); 96 / 192 rows are where
# the GEMM's task grid starts splitting the batch.
BATCHES = [1, 16, 17, 56, 57, 58, 95, 193, 227, 228, 229, 511, 512, 513, 600]


@pytest.mark.parametrize("batch", BATCHES)
def test_int8_activations_match_the_formula_on_any_thread_count(batch):
    qw = QuantizedWeight.quantize(rand((576, 200), 3), group_size=32)
    x = rand((batch, 576), 100 + batch)
    y = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(y, formula_f32(qw, x))
    with quantrs.threads(1):
        np.testing.assert_array_equal(qw.matmul(x, activations="int8"), y)


@pytest.mark.parametrize("batch", BATCHES)
def test_float32_matches_float64_on_any_thread_count(batch):
    qw = QuantizedWeight.quantize(rand((576, 200), 4), group_size=32)
    x = rand((batch, 576), 200 + batch)
    y = qw.matmul(x)
    w = qw.dequantize().astype(np.float64)
    x64 = x.astype(np.float64)
    bound = 1e-5 * (np.abs(x64) @ np.abs(w)) + 1e-6
    assert np.all(np.abs(y - x64 @ w) <= bound)
    with quantrs.threads(1):
        np.testing.assert_array_equal(qw.matmul(x), y)


@pytest.mark.parametrize("row", [0, 300, 599])
def test_non_finite_in_any_band_is_a_value_error_naming_its_index(row):
    qw = QuantizedWeight.quantize(rand((576, 64), 5), group_size=32)
    x = rand((600, 576), 6)
    x[row, 7] = np.inf
    with pytest.raises(ValueError, match=rf"\[{row}, 7\]"):
        qw.matmul(x, activations="int8")


def test_a_huge_row_anywhere_is_scaled_into_range():
    """The range check's pieces find a row beyond 2^64 wherever it lies; its outputs are
    those of the row scaled down, scaled back (exact powers of two)."""
    qw = QuantizedWeight.quantize(rand((576, 64), 7), group_size=32)
    x = rand((600, 576), 8)
    y0 = qw.matmul(x)
    for row in (0, 333, 599):
        xs = x.copy()
        xs[row] *= np.float32(2.0**100)
        y = qw.matmul(xs)
        assert np.all(np.isfinite(y))
        np.testing.assert_array_equal(y[row], y0[row] * np.float32(2.0**100))
        np.testing.assert_array_equal(np.delete(y, row, 0), np.delete(y0, row, 0))


@pytest.mark.parametrize("batch", [64, 97, 130, 301, 512])
def test_fresh_results_hold_no_stale_values(batch):
    """The GEMM writes its new result array without zeroing it first: every element is this
    call's, even where the allocator hands back the memory of a freed result of the same shape
    (a call on another weight, then dropped), at batches of 3k + 1 rows and with a depth that
    the tiles do not divide (1100 inputs) and columns short of a panel (200)."""
    x = rand((batch, 1100), 300 + batch)
    qa = QuantizedWeight.quantize(rand((1100, 200), 9), group_size=32)
    qb = QuantizedWeight.quantize(rand((1100, 200), 10), group_size=32)
    w = qb.dequantize().astype(np.float64)
    x64 = x.astype(np.float64)
    bound = 1e-5 * (np.abs(x64) @ np.abs(w)) + 1e-6
    for _ in range(3):
        stale = qa.matmul(x * np.float32(1e3))
        del stale
        y = qb.matmul(x)
        assert np.all(np.abs(y - x64 @ w) <= bound)
