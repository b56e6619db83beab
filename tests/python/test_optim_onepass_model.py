"""The one-pass layout's knobs of the NumPy state model (``benches/convergence/simulate.py``,
docs/optim.md "A one-pass state layout: the estimate"): block scales stored as one half or
bfloat16 per block, and the ``sqrt_pow2h`` v map whose nearest code is closed form in the
float32 bits. Checked against ml_dtypes / NumPy rounding and a brute-force nearest search.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benches"))

from convergence import simulate as S  # noqa: E402

F = np.float32


def _scales():
    rng = np.random.default_rng(3)
    x = (10.0 ** rng.uniform(-7, 4, 4000)).astype(F)
    # exact halves / bfloat16 values must stay put
    return np.concatenate([x, np.float16([1.0, 0.5, 3.0, 6.1e-5]).astype(F), [F(0.0)]])


@pytest.mark.parametrize("kind, dtype", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_half_up_is_the_smallest_half_not_below(kind, dtype):
    x = _scales()
    up = S.ScaleStore(f"{kind}_up", np.random.default_rng(0))(x)
    # a value of the 2-byte type, not below the scale ...
    assert np.array_equal(up.astype(dtype).astype(F), up)
    assert np.all(up >= x)
    # ... and its next value down (in the 2-byte type) is below the scale
    below = np.nextafter(up.astype(dtype), dtype(0)).astype(F)
    nz = up > 0
    assert np.all(below[nz] < x[nz])
    assert up[x == 0].tolist() == [0.0]


def test_f16_scale_saturates_at_the_largest_half():
    up = S.ScaleStore("f16_up", np.random.default_rng(0))(np.array([65504, 7e4, 1e30], F))
    assert up.tolist() == [65504.0] * 3


@pytest.mark.parametrize("kind, dtype", [("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_half_nearest_matches_the_cast(kind, dtype):
    x = _scales()
    got = S.ScaleStore(f"{kind}_nearest", np.random.default_rng(0))(x)
    assert np.array_equal(got, x.astype(dtype).astype(F))


def test_pow2h_table_and_closed_form_code():
    t = S._pow2h_table()
    want = sorted([2.0**-k for k in range(8)] + [1.5 * 2.0**-k for k in range(1, 9)])
    assert t.tolist() == want
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(0, 1, 20000), 10.0 ** rng.uniform(-4, 0, 20000)]).astype(F)
    x = np.concatenate([x, (t[:-1] + t[1:]) / 2 * F(1 - 2e-7), (t[:-1] + t[1:]) / 2 * F(1 + 2e-7)])
    x = np.concatenate([x, t, [F(0), F(1)]]).astype(F)
    bits = x.view(np.uint32).astype(np.int64)
    base = int(np.float32(1.5 * 2.0**-8).view(np.uint32))
    closed = np.clip((bits - base + (1 << 21)) >> 22, 0, 15)
    brute = np.argmin(np.abs(x[:, None].astype(np.float64) - t[None, :]), axis=1)
    assert np.array_equal(closed, brute)
    assert np.array_equal(S._nearest(t, x), brute)


def test_one_pass_layout_stores_the_first_moments_within_a_code():
    # From a zero state, the first step's moments are m = (1 - b1) g and sqrt(v) = sqrt(1 - b2) |g|.
    sim = S.SimAdamW4bit(
        1e-3, 0.0, method="int4", variance_map="sqrt_pow2h", block_size=128,
        m_scales="f16_up", v_scales="f32",
    )  # fmt: skip
    rng = np.random.default_rng(0)
    g = (rng.standard_normal(1000) * 10.0 ** rng.uniform(-3, 0, 1000)).astype(F)
    sim.update(np.zeros(1000, F), g, name="w")
    mc, vc, ms, vs = sim.state["w"]
    assert len(ms) == len(vs) == 8  # blocks of 128
    assert np.array_equal(ms.astype(np.float16).astype(F), ms)
    m, r = F(0.1) * g, np.sqrt(F(0.001) * g * g)
    m_hat = (S.M_TABLES["int4"][mc] * np.repeat(ms, 128))[:1000]
    r_hat = (S._pow2h_table()[vc] * np.repeat(vs, 128))[:1000]
    # int4: k/7, so within half a step of the block's scale
    assert np.all(np.abs(m_hat - m) <= np.repeat(ms, 128)[:1000] / 14 * (1 + 1e-5))
    # pow2h: neighbours 4:3 or 3:2 apart, so within 20 % above the smallest code
    big = r >= np.repeat(vs, 128)[:1000] * 2.0**-7
    assert big.sum() > 500
    assert np.all(np.abs(r_hat - r)[big] <= 0.2 * r[big] * (1 + 1e-5))
    with pytest.raises(ValueError):
        S.ScaleStore("f8_up", rng)
