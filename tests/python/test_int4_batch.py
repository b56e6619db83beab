"""`QuantizedWeight.matmul` at the small batches the multi-row matvec serves
(2 to 16 rows with the AVX2 kernel, docs/int4.md) against a float64 NumPy
product with the dequantized weight, on odd shapes, one piece and many."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import rand

from quantrs import QuantizedWeight

pytestmark = pytest.mark.kernel

# (in_feat, out_feat, group_size): odd sizes, column tails short of a vector,
# one group, many groups, and one large enough to be cut into column pieces.
SHAPES = [(33, 17, 32), (257, 129, 32), (300, 301, 128), (7, 23, 2), (1024, 1000, 32)]


def assert_within_bound(qw, x, y):
    """``y`` against float64 ``x @ w`` within docs/int4.md's bound, per output and row;
    returns ``(x64, w64, bound)`` for further checks."""
    w = qw.dequantize().astype(np.float64)
    x64 = x.astype(np.float64)
    bound = 1e-5 * (np.abs(x64) @ np.abs(w)) + 1e-6
    err = np.abs(y.astype(np.float64) - x64 @ w)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"
    return x64, w, bound


@pytest.mark.parametrize("batch", [2, 3, 4, 7, 8, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_small_batches_within_the_bound(shape, batch):
    k, n, gs = shape
    qw = QuantizedWeight.quantize(rand((k, n), k + n), group_size=gs, method="rtn")
    x = rand((batch, k), batch)
    # Rows of very different magnitudes: the bound is per output and row.
    x *= (np.float32(10.0) ** (np.arange(batch) % 7 - 3)).astype(np.float32)[:, None]
    y = qw.matmul(x)
    x64, w, bound = assert_within_bound(qw, x, y)
    # Each row alone through matvec: the same product within the same bound.
    for r in (0, batch - 1):
        err_r = np.abs(qw.matvec(x[r]).astype(np.float64) - x64[r] @ w)
        assert np.all(err_r <= bound[r])


# Prefill-sized batches through the blocked GEMM (docs/int4.md): SmolLM2's
# shapes, whose tiles are cut to equal sizes or to one panel a task, and odd
# ones with partial panels and depth blocks that do not divide in_feat.
PREFILL_SHAPES = [(576, 576, 32), (576, 192, 128), (1536, 576, 32), (577, 600, 128), (130, 33, 2)]


@pytest.mark.parametrize("batch", [17, 64, 130])
@pytest.mark.parametrize("shape", PREFILL_SHAPES)
def test_prefill_batches_within_the_bound(shape, batch):
    k, n, gs = shape
    qw = QuantizedWeight.quantize(rand((k, n), k * n), group_size=gs)
    x = rand((batch, k), batch + k)
    x *= (np.float32(10.0) ** (np.arange(batch) % 5 - 2)).astype(np.float32)[:, None]
    y = qw.matmul(x)
    assert_within_bound(qw, x, y)
    # Into a caller's buffer: the same values.
    out = np.full((batch, n), np.nan, dtype=np.float32)
    qw.matmul(x, out=out)
    np.testing.assert_array_equal(out, y)
