"""State format 2: v's double-quantized block scales are rounded without bias, as the NumPy
oracle (``quantrs.reference.optim.dq_round_v_scales``) models them."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
from quantrs.reference import optim as R

kernel = pytest.mark.kernel


def one_step(n=64 * 300 + 10, seed=5):
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * np.exp(rng.uniform(-9, 0, n))).astype(np.float32)
    g[64 * 7 : 64 * 8] = 0  # an all-zero block
    opt = quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(1e-3), quantrs.AdvancedQuantizationConfig()
    )
    opt.update(np.zeros(n, np.float32), g, name="w")
    # After one step from zero state, v = (1 - b2) g^2 exactly and u = sqrt(v).
    u = np.sqrt((np.float32(1) - np.float32(0.999)) * (g * g))
    u_max = np.maximum.reduceat(u, np.arange(0, n, 64))
    u_max = np.where(u_max > 0, np.clip(u_max, 1e-8, 1e8), 0).astype(np.float32)
    return opt.state_dict(), u_max, n


@kernel
def test_v_scale_codes_match_the_oracle():
    sd, u_max, n = one_step()
    codes = sd["n:w/v_scale_codes"]
    groups = sd["n:w/v_scale_groups"].astype(np.float64)
    agree = total = 0
    for gi, (mx, step) in enumerate(groups):
        x = u_max[gi * 256 : (gi + 1) * 256]
        t = (mx * np.exp2(np.arange(256) * step)).astype(np.float32)
        t[255] = 0
        blocks = gi * 256 + np.arange(len(x))
        u = R.dither_uniform(1, n, blocks)
        want = R.dq_round_v_scales(x, t, u)
        got = codes[gi * 256 : gi * 256 + len(x)]
        # The oracle's table comes from NumPy's exp2, the extension's from its own
        # polynomial (equal to ~1e-6): only near-ties of the draw may differ.
        up = np.minimum(want, 254)
        gap = t[np.maximum(up - 1, 0)] - t[up]
        near = np.abs(np.asarray(u, np.float64) * gap - (t[np.maximum(up - 1, 0)] - x)) < 1e-4 * (
            gap + 1e-30
        )
        ok = (got == want) | near
        assert ok.all(), np.flatnonzero(~ok)
        agree += int((got == want).sum())
        total += len(x)
        assert np.all(got[x == 0] == 255)
    assert agree >= 0.99 * total
    # Unbiased: about as many blocks rounded down as the probabilities say, and some were.
    m, v = R.decode_moments(sd, "n:w")
    vs = np.repeat(
        np.sqrt(v).reshape(-1)[: n - n % 64].reshape(-1, 64).max(1), 1
    )  # decoded u of each block's largest element
    assert np.any(vs < u_max[: len(vs)] * (1 - 1e-6))


def test_uniform_numbers_are_the_documented_hash():
    # The same pin as the Rust unit test `dither::tests::uniform_matches_the_documented_hash`.
    assert int(R.splitmix64(0)) == 0xE220A8397B1DCDAF
    key = R.splitmix64((7 * 0x9E3779B97F4A7C15) & ((1 << 64) - 1) ^ 1000)
    z = int(R.splitmix64(int(key) ^ 259))
    assert R.dither_uniform(7, 1000, [259])[0] == np.float32((z >> 40) / 16777216.0)
    u = R.dither_uniform(3, 12345, np.arange(100000))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
