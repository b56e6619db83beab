"""QuantizedWeight against the pure-NumPy reference (docs/int4.md)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import assert_gil_released, rand
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import quantrs
from quantrs import QuantizedWeight, reference

pytestmark = pytest.mark.kernel

DATA = Path(__file__).resolve().parents[1] / "data"


def assert_within_bound(x, qw, y):
    """|y - y_ref| <= 1e-5 * sum_i |x_i w_io| + 1e-6, against float64."""
    w = qw.dequantize().astype(np.float64)
    x64 = np.atleast_2d(x).astype(np.float64)
    y_ref = x64 @ w
    bound = 1e-5 * (np.abs(x64) @ np.abs(w)) + 1e-6
    err = np.abs(np.atleast_2d(y).astype(np.float64) - y_ref)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


# --- bit-exact quantization -------------------------------------------------

half_steps = st.integers(-14, 14).map(lambda i: np.float32(i / 2))
weights = st.tuples(st.integers(1, 70), st.integers(1, 20)).flatmap(
    lambda s: hnp.arrays(
        np.float32,
        s,
        elements=st.one_of(
            st.floats(-100, 100, width=32),
            half_steps,
            st.sampled_from([0.0, -0.0, 1e-40, -1e-45, 7.0, -7.0, 3.5, 1e-8]),
        ),
    )
)


@given(w=weights, group_half=st.integers(1, 40))
def test_dequantize_bit_exact_against_reference(w, group_half):
    gs = 2 * group_half
    qw = QuantizedWeight.quantize(w, group_size=gs, method="rtn")
    expect = reference._fake_quantize_int4(w, gs)
    np.testing.assert_array_equal(qw.dequantize().view(np.uint32), expect.view(np.uint32))
    q, scales = reference.quantize_int4(w, gs)
    np.testing.assert_array_equal(qw.data, reference.pack_int4(q))
    np.testing.assert_array_equal(qw.scales, scales.reshape(-1))
    assert qw.num_groups == scales.shape[0]
    assert (qw.in_feat, qw.out_feat) == w.shape


def test_ties_round_to_even():
    # Column absmax 7 -> scale exactly 1; halves must round to even.
    w = np.array([[7.0], [2.5], [-2.5], [0.5], [1.5], [-3.5]], dtype=np.float32)
    qw = QuantizedWeight.quantize(w, method="rtn")
    assert qw.dequantize().ravel().tolist() == [7.0, 2.0, -2.0, 0.0, 2.0, -4.0]


def test_nibble_layout_bytes():
    # Rows 0 and 1 share a byte: row 0 in the low nibble, row 1 in the high.
    w = np.array([[7.0, -7.0], [-1.0, 3.0]], dtype=np.float32)
    qw = QuantizedWeight.quantize(w, method="rtn")
    assert qw.data.tolist() == [(0x7) | (0xF << 4), (0x9) | (0x3 << 4)]
    assert qw.scales.tolist() == [1.0, 1.0]


def test_flat_input_form_and_odd_small_in_feat():
    w = rand((5, 3), 1)
    a = QuantizedWeight.quantize(w.ravel(), 5, 3, method="rtn")
    b = QuantizedWeight.quantize(w, method="rtn")
    assert a == b and a.group_size == 6 and a.num_groups == 1
    np.testing.assert_array_equal(a.dequantize(), reference._fake_quantize_int4(w))


def test_cross_vectors_file_is_current():
    """tests/data/int4_cases.safetensors (checked by the Rust tests) is what
    the reference produces today."""
    from safetensors.numpy import load_file

    sys.path.insert(0, str(DATA))
    try:
        import make_int4_cases
    finally:
        sys.path.pop(0)
    stored = load_file(str(DATA / "int4_cases.safetensors"))
    fresh = make_int4_cases.build()
    assert stored.keys() == fresh.keys()
    for k, v in fresh.items():
        np.testing.assert_array_equal(stored[k], v, err_msg=k)


# --- kernels ----------------------------------------------------------------


@given(
    k=st.integers(1, 300),
    n=st.integers(1, 140),
    b=st.integers(1, 20),
    gs=st.sampled_from([2, 8, 32, 128]),
    seed=st.integers(0, 1000),
)
def test_matvec_matmul_accuracy(k, n, b, gs, seed):
    w, x = rand((k, n), seed), rand((b, k), seed + 1)
    qw = QuantizedWeight.quantize(w, group_size=gs, method="rtn")
    assert_within_bound(x, qw, qw.matmul(x))
    assert_within_bound(x[0], qw, qw.matvec(x[0]))


def test_large_gemm_accuracy_and_out():
    qw = QuantizedWeight.quantize(rand((1000, 700), 3), group_size=128, method="rtn")
    x = rand((64, 1000), 4)
    out = np.full((64, 700), np.nan, dtype=np.float32)
    res = qw.matmul(x, out=out)
    assert res is out
    assert_within_bound(x, qw, out)
    np.testing.assert_array_equal(out, qw.matmul(x))


@pytest.mark.parametrize("gs", [128, 256])
def test_large_matvec_from_dram_accuracy_and_threads(gs):
    """A matrix large enough (4 MiB packed) that the AVX2 matvec walks its groups in slabs
    with carried sums: within the float64 bound, an odd width (vector and scalar tails), and
    the same bits on one thread as on the pool."""
    k, n = 4096, 2051
    qw = QuantizedWeight.quantize(rand((k, n), 11), group_size=gs, method="rtn")
    x = rand((k,), 12)
    y = qw.matvec(x)
    assert_within_bound(x, qw, y)
    with quantrs.threads(1):
        np.testing.assert_array_equal(qw.matvec(x), y)


def test_special_activations():
    qw = QuantizedWeight.quantize(rand((64, 40), 5), method="rtn")
    for x in (np.zeros(64, np.float32), np.full(64, 1e-40, np.float32), -np.ones(64, np.float32)):
        assert_within_bound(x, qw, qw.matvec(x))
    y = qw.matvec(np.full(64, np.nan, np.float32))
    assert np.all(np.isnan(y))


def test_dequantize_to_fills_callers_array():
    w = rand((40, 9), 6)
    qw = QuantizedWeight.quantize(w, method="rtn")
    out = np.empty((40, 9), np.float32)
    assert qw.dequantize_to(out) is None
    np.testing.assert_array_equal(out, reference._fake_quantize_int4(w))


# --- zero-copy views ----------------------------------------------------------


def test_views_are_read_only_zero_copy_and_keep_owner_alive():
    qw = QuantizedWeight.quantize(rand((64, 8), 7), method="rtn")
    d1, d2 = qw.data, qw.data
    assert np.shares_memory(d1, d2)
    assert not d1.flags.writeable and not qw.scales.flags.writeable
    with pytest.raises(ValueError):
        d1[0] = 1
    assert d1.base is qw
    expect = d1.copy()
    del qw
    np.testing.assert_array_equal(d1, expect)
    assert d1.dtype == np.uint8 and d2.shape == (32 * 8,)


def test_input_fast_path_and_conversion():
    qw = QuantizedWeight.quantize(rand((16, 4), 8), method="rtn")
    x32 = rand(16, 9)
    np.testing.assert_array_equal(qw.matvec(x32.astype(np.float64)), qw.matvec(x32))
    np.testing.assert_array_equal(qw.matvec(list(map(float, x32))), qw.matvec(x32))
    strided = np.repeat(x32, 2)[::2]
    np.testing.assert_array_equal(qw.matvec(strided), qw.matvec(x32))


# --- bad input ------------------------------------------------------------------


def test_bad_quantize_inputs():
    with pytest.raises(quantrs.DimensionMismatch, match="in_feat"):
        QuantizedWeight.quantize(np.zeros((0, 4), np.float32), method="rtn")
    with pytest.raises(quantrs.DimensionMismatch):
        QuantizedWeight.quantize(np.zeros(12, np.float32), method="rtn")
    with pytest.raises(ValueError, match="group_size"):
        QuantizedWeight.quantize(rand((8, 2)), group_size=3, method="rtn")
    with pytest.raises(ValueError, match="group_size"):
        QuantizedWeight.quantize(rand((8, 2)), group_size=0, method="rtn")
    w = rand((8, 3))
    w[5, 2] = np.nan
    with pytest.raises(ValueError, match=r"\[5, 2\]"):
        QuantizedWeight.quantize(w, method="rtn")
    w[5, 2] = -np.inf
    with pytest.raises(ValueError, match="non-finite"):
        QuantizedWeight.quantize(w, method="rtn")
    with pytest.raises(TypeError, match="w"):
        QuantizedWeight.quantize(np.array([["a", "b"]]), method="rtn")
    with pytest.raises(ValueError):
        QuantizedWeight.quantize(rand((4, 3)).ravel(), 4, method="rtn")
    with pytest.raises(quantrs.DimensionMismatch):
        QuantizedWeight.quantize(rand((4, 3)), 3, 4, method="rtn")


def test_bad_kernel_inputs():
    qw = QuantizedWeight.quantize(rand((16, 4)), method="rtn")
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        qw.matvec(np.ones(15, np.float32))
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        qw.matmul(np.ones(16, np.float32))
    with pytest.raises(quantrs.DimensionMismatch, match="out"):
        qw.matvec(np.ones(16, np.float32), out=np.empty(5, np.float32))
    with pytest.raises(TypeError, match="out"):
        qw.matvec(np.ones(16, np.float32), out=np.empty(4, np.float64))
    with pytest.raises(TypeError, match="out"):
        qw.matvec(np.ones(16, np.float32), out=[0.0] * 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        qw.matmul(np.ones((2, 16), np.float32), out=np.empty((4, 2), np.float32).T)
    ro = np.empty(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        qw.matvec(np.ones(16, np.float32), out=ro)
    with pytest.raises(ValueError, match="out"):
        qw.dequantize_to(np.empty((16, 4), np.float32)[:, ::-1])
    with pytest.raises(quantrs.DimensionMismatch):
        qw.dequantize_to(np.empty((4, 16), np.float32))


def test_out_aliasing_input_is_rejected():
    qw = QuantizedWeight.quantize(rand((8, 8)), method="rtn")
    buf = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        qw.matmul(buf, out=buf)


def test_raw_constructor_validates():
    qw = QuantizedWeight.quantize(rand((40, 3), 2), method="rtn")
    args = dict(data=qw.data, scales=qw.scales, in_feat=40, out_feat=3, num_groups=2)
    assert QuantizedWeight(**args) == qw
    bad = [
        dict(data=qw.data[1:]),
        dict(scales=qw.scales[1:]),
        dict(in_feat=0),
        dict(out_feat=0),
        dict(num_groups=0),
        dict(num_groups=3),
        dict(scales=np.where(np.arange(6) == 2, np.nan, qw.scales).astype(np.float32)),
        dict(scales=np.where(np.arange(6) == 4, np.inf, qw.scales).astype(np.float32)),
    ]
    for change in bad:
        with pytest.raises(ValueError):
            QuantizedWeight(**{**args, **change})
    with pytest.raises(TypeError):
        QuantizedWeight(np.array(["x"] * 60), qw.scales, 40, 3, 2)


# --- persistence ------------------------------------------------------------------


def test_pickle_repr_eq():
    qw = QuantizedWeight.quantize(rand((33, 5), 3), group_size=8, method="rtn")
    back = pickle.loads(pickle.dumps(qw))
    assert back == qw and back is not qw
    assert back != QuantizedWeight.quantize(rand((33, 5), 4), group_size=8, method="rtn")
    assert repr(qw) == (
        "QuantizedWeight(in_feat=33, out_feat=5, num_groups=5, group_size=8, nbytes=200)"
    )
    assert qw.nbytes == qw.data.nbytes + qw.scales.nbytes


def test_save_load_safetensors(tmp_path):
    from safetensors.numpy import load_file

    qw = QuantizedWeight.quantize(rand((70, 6), 5), group_size=16, method="rtn")
    path = tmp_path / "w.safetensors"
    qw.save(path)
    assert QuantizedWeight.load(path) == qw
    tensors = load_file(str(path))
    assert tensors["data"].dtype == np.uint8 and tensors["data"].shape == (40, 6)
    assert tensors["scales"].dtype == np.float32 and tensors["scales"].shape == (5, 6)
    blob = path.read_bytes()
    (tmp_path / "cut").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(quantrs.SerializationError):
        QuantizedWeight.load(tmp_path / "cut")
    with pytest.raises(FileNotFoundError):
        QuantizedWeight.load(tmp_path / "missing.safetensors")
    with pytest.raises(quantrs.SerializationError):
        QuantizedWeight.from_bytes(b"\x00" * 16)


def test_cuda_entry_point_reports_unavailable():
    qw = QuantizedWeight.quantize(rand((8, 2)), method="rtn")
    assert qw.to("cpu") is qw
    assert quantrs.cuda_available() is False
    with pytest.raises(quantrs.CudaNotAvailable):
        qw.to("cuda")


# --- threads and SIMD levels --------------------------------------------------------


def test_gil_released_during_kernel():
    """Another Python thread runs while one long kernel call is in flight."""
    qw = QuantizedWeight.quantize(rand((4096, 2048), 1), method="rtn")
    x = rand((384, 4096), 2)
    assert_gil_released(lambda: qw.matmul(x))


def test_simd_override_only_lowers():
    code = "import quantrs; print(quantrs.build_info()['simd'])"
    env = {**os.environ, "QUANTRS_SIMD": "scalar"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "scalar"
    detected = quantrs.build_info()["simd_detected"]
    env["QUANTRS_SIMD"] = "avx512"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() in {detected, "avx512"} and (
        out.stdout.strip() == "avx512" or detected != "avx512"
    )


def test_build_info_names_the_matvec_kernel_of_the_level():
    code = "import quantrs; i = quantrs.build_info(); print(i['simd'], i['int4_matvec'])"
    for level, allowed in [
        ("scalar", {"scalar"}),
        ("avx2", {"avx2", "scalar"}),
        ("avx512", {"avx512-vnni", "avx512", "avx2", "scalar"}),
    ]:
        env = {**os.environ, "QUANTRS_SIMD": level}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        simd, kernel = out.stdout.split()
        assert kernel in allowed, (level, simd, kernel)
        # The kernel follows the level in force: never above it.
        assert kernel.split("-")[0] == simd or (simd == "neon" and kernel == "scalar"), (
            level,
            simd,
            kernel,
        )
