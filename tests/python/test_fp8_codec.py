"""quantrs.fp8 codecs: bit-exact against ml_dtypes, saturation, views, errors."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _helpers import assert_gil_released
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import quantrs
from quantrs import fp8
from quantrs.reference import fp8_grid, fp8_round

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
MAX = {"e4m3": 0x7E, "e5m2": 0x7B}
OVF = {"e4m3": 0x7F, "e5m2": 0x7C}
FMTS = ["e4m3", "e5m2"]


def ml_codes(x: np.ndarray, fmt: str) -> np.ndarray:
    return np.asarray(x).astype(ML[fmt]).view(np.uint8)


def saturated_expect(x: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' codes with every non-NaN overflow replaced by +-max."""
    x = np.asarray(x, dtype=np.float32)
    codes = ml_codes(x, fmt).copy()
    over = ~np.isnan(x) & ((codes & 0x7F) == OVF[fmt])
    codes[over] = (codes[over] & 0x80) | MAX[fmt]
    return codes


pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("fmt", FMTS)
def test_all_float16_values_bit_exact(fmt):
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    assert np.array_equal(fp8.encode(h, fmt), ml_codes(h, fmt))
    assert np.array_equal(fp8.encode(h.astype(np.float32), fmt), ml_codes(h, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_random_float32_bit_patterns_bit_exact(fmt):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, size=3_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    assert np.array_equal(fp8.encode(x, fmt), ml_codes(x, fmt))
    # And the saturating mode on the same patterns.
    assert np.array_equal(fp8.encode(x, fmt, saturate=True), saturated_expect(x, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_edge_values(fmt):
    base = [448, 464, 465, 480, 2**-9, 2**-10, 61439, 61440, 57344, 0.0, np.inf, np.nan]
    base += [2**-16, 2**-17, 2**-18, 1.5 * 2**-10, 1e-45, 3.4e38, 240, 232, 248]
    x = np.array(base + [-v for v in base], dtype=np.float32)
    x = np.concatenate([x, -np.zeros(1, np.float32)])
    assert np.array_equal(fp8.encode(x, fmt), ml_codes(x, fmt))
    assert np.array_equal(fp8.encode(x, fmt, saturate=True), saturated_expect(x, fmt))


def test_documented_edge_codes():
    e = fp8.encode(np.array([448, 464, 465, -np.inf, 2**-9, 2**-10, -0.0], np.float32))
    assert list(e) == [0x7E, 0x7E, 0x7F, 0xFF, 0x01, 0x00, 0x80]
    s = fp8.encode(np.array([465, -np.inf, np.inf, np.nan], np.float32), saturate=True)
    assert list(s) == [0x7E, 0xFE, 0x7E, 0x7F]
    e5 = fp8.encode(np.array([61439, 61440, np.inf, np.nan, -np.nan], np.float32), "e5m2")
    assert list(e5) == [0x7B, 0x7C, 0x7C, 0x7E, 0xFE]
    s5 = fp8.encode(np.array([61440, -np.inf], np.float32), "e5m2", saturate=True)
    assert list(s5) == [0x7B, 0xFB]


@pytest.mark.parametrize("fmt", FMTS)
def test_nan_payloads_match_ml_dtypes(fmt):
    rng = np.random.default_rng(3)
    payload = rng.integers(1, 1 << 23, size=10_000, dtype=np.uint32)
    bits = np.concatenate([0x7F800000 | payload, 0xFF800000 | payload]).astype(np.uint32)
    x = bits.view(np.float32)
    assert np.array_equal(fp8.encode(x, fmt), ml_codes(x, fmt))
    assert np.array_equal(fp8.encode(x, fmt, saturate=True), ml_codes(x, fmt))


@pytest.mark.parametrize("fmt", FMTS)
def test_decode_every_code_bitwise(fmt):
    c = np.arange(256, dtype=np.uint8)
    want = c.view(ML[fmt]).astype(np.float32)
    got = fp8.decode(c, fmt)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # Long arrays (SIMD body, threads, tails).
    big = np.random.default_rng(1).integers(0, 256, size=300_001, dtype=np.uint8)
    want = big.view(ML[fmt]).astype(np.float32)
    assert np.array_equal(fp8.decode(big, fmt).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("fmt", FMTS)
def test_decode_matches_the_numpy_grid(fmt):
    g = fp8_grid(fmt)
    codes = np.arange(len(g), dtype=np.uint8)
    assert np.array_equal(fp8.decode(codes, fmt).astype(np.float64), g)
    assert np.array_equal(fp8.decode(codes | 0x80, fmt).astype(np.float64), -g)


@pytest.mark.parametrize("fmt", FMTS)
def test_saturating_round_matches_reference(fmt):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(50_000) * rng.choice([1e-4, 1, 100, 1e5], 50_000)).astype(np.float32)
    got = fp8.decode(fp8.encode(x, fmt, saturate=True), fmt)
    assert np.array_equal(got.astype(np.float64), fp8_round(x, fmt, True))


@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=0, max_dims=3, max_side=40),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    ),
    st.sampled_from(FMTS),
)
def test_hypothesis_arrays_bit_exact(x, fmt):
    got = fp8.encode(x, fmt)
    assert got.shape == x.shape and got.dtype == np.uint8
    assert np.array_equal(got, ml_codes(x, fmt))


def test_shapes_and_layouts():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert fp8.encode(x).shape == (2, 3, 4)
    nc = x[:, ::2, ::-1]  # non-contiguous: converted, not an error
    assert np.array_equal(fp8.encode(nc), ml_codes(nc, "e4m3"))
    assert fp8.encode(np.float32(3.0)).shape == ()
    assert fp8.encode(np.zeros(0, np.float32)).shape == (0,)
    assert fp8.decode(np.zeros((0, 3), np.uint8)).shape == (0, 3)
    assert np.array_equal(fp8.encode([1.0, 2.0]), [0x38, 0x40])


def test_ml_dtypes_views_are_zero_copy():
    x = np.linspace(-500, 500, 1001, dtype=np.float32)
    f8 = fp8.encode(x, "e4m3", as_ml_dtypes=True)
    assert f8.dtype == ml_dtypes.float8_e4m3fn
    assert np.array_equal(f8.view(np.uint8), ml_codes(x, "e4m3"))
    u8 = fp8.codes(f8)
    assert u8.dtype == np.uint8 and np.shares_memory(u8, f8)
    v = fp8.view(u8, "e4m3")
    assert np.shares_memory(v, u8)
    # decode takes the format from the dtype.
    f5 = x.astype(ml_dtypes.float8_e5m2)
    assert np.array_equal(fp8.decode(f5), f5.astype(np.float32), equal_nan=True)
    with pytest.raises(ValueError, match="contradicts"):
        fp8.decode(f5, "e4m3")


def test_bad_inputs():
    with pytest.raises(ValueError, match="fmt"):
        fp8.encode(np.ones(3, np.float32), "e3m4")
    with pytest.raises(ValueError, match="fmt"):
        quantrs._core.fp8_encode(np.ones(3, np.float32), "int8")
    with pytest.raises(TypeError, match="codes"):
        fp8.decode(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="codes"):
        fp8.decode(np.ones(3, np.int16))
    with pytest.raises(TypeError, match="x"):
        fp8.encode(np.array(["a", "b"]))
    with pytest.raises(TypeError):
        fp8.codes(np.ones(3, np.uint8))
    with pytest.raises(TypeError):
        fp8.view(np.ones(3, np.float32))


def test_gil_released_during_encode():
    x = np.random.default_rng(0).standard_normal(1 << 25).astype(np.float32)

    def work():
        for _ in range(3):
            fp8.encode(x)

    assert_gil_released(work)
