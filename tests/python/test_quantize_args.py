"""The float quantizers' shared arguments (``w`` [out, in], ``importance`` [in]) of
``GgufWeight.quantize``, ``Int4AsymWeight.quantize`` and ``Int4KWeight.quantize``: every
bad value raises the documented class with a message that names the argument, the bad
element (of the lowest bad row, on any thread count) and the expected value, and leaves
the input untouched; and the quantizers run under ``quantrs.threads`` like the kernels,
with the same bytes under every cap (also ``QuantizedWeight.quantize`` and
``IntZpWeight.quantize``)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import quantrs
from quantrs import GgufWeight, Int4AsymWeight, Int4KWeight

# Each entry point with a type that takes importance (q4_1: ggml's weighted search).
QUANTIZERS = {
    "gguf q4_1": lambda w, **k: GgufWeight.quantize(w, "q4_1", **k),
    "gguf q6_k": lambda w, **k: GgufWeight.quantize(w, "q6_k", **k),
    "int4_asym": lambda w, **k: Int4AsymWeight.quantize(w, **k),
    "int4_k": lambda w, **k: Int4KWeight.quantize(w, **k),
}


def weight(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 256)).astype(np.float32)


def raises(call, exc, *words: str) -> None:
    with pytest.raises(exc) as e:
        call()
    for word in words:
        assert word in str(e.value), str(e.value)


@pytest.mark.parametrize("name", QUANTIZERS)
@pytest.mark.parametrize(
    ("value", "shown"),
    [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf"), (3e38, "3e38"), (65520.0, "65520.0")],
)
def test_bad_weight_values_name_w_the_element_and_the_bound(name, value, shown):
    w = weight()
    w[2, 77] = value
    before = w.copy()
    raises(
        lambda: QUANTIZERS[name](w),
        quantrs.InvalidArgument,
        f"w[2, 77] is {shown}",
        "expected a finite value with |w| <= 65504",
    )
    np.testing.assert_array_equal(w, before)


@pytest.mark.parametrize("name", QUANTIZERS)
@pytest.mark.parametrize("cap", [1, 2])
def test_a_bad_value_in_a_late_row_names_the_lowest_bad_row_on_any_thread_count(name, cap):
    # Each row is checked inside the row-parallel loop (no pass of its own over w):
    # the error still names the first bad value of the lowest bad row, however the
    # rows are split over the threads.
    w = np.random.default_rng(6).standard_normal((256, 256)).astype(np.float32)
    w[255, 3] = np.nan
    w[201, 40] = 65520.0
    w[201, 41] = np.inf
    w[230, 0] = -np.inf
    before = w.copy()
    with quantrs.threads(cap):
        raises(
            lambda: QUANTIZERS[name](w),
            quantrs.InvalidArgument,
            "w[201, 40] is 65520.0",
            "expected a finite value with |w| <= 65504",
        )
    np.testing.assert_array_equal(w, before)


@pytest.mark.parametrize("name", QUANTIZERS)
def test_the_largest_half_is_accepted(name):
    w = weight()
    w[1, 3] = 65504.0
    w[2, 9] = -65504.0
    assert QUANTIZERS[name](w).shape == (3, 256)


@pytest.mark.parametrize("name", QUANTIZERS)
def test_bad_weight_types_and_shapes_name_w(name):
    w = weight()
    q = QUANTIZERS[name]
    raises(lambda: q(w.astype(np.complex64)), TypeError, "w", "float32")
    raises(lambda: q(np.array([["a"] * 256])), TypeError, "w")
    raises(lambda: q(w[0]), quantrs.DimensionMismatch, "w", "2-D", "[256]")
    raises(lambda: q(w[None]), quantrs.DimensionMismatch, "w", "2-D", "[1, 3, 256]")


@pytest.mark.parametrize("name", QUANTIZERS)
def test_bad_importance_names_importance_and_the_expected_value(name):
    w = weight()
    q = QUANTIZERS[name]
    imp = np.ones(256, np.float32)
    for bad, shown in ((-1.0, "-1"), (np.nan, "NaN"), (np.inf, "inf")):
        i = imp.copy()
        i[9] = bad
        raises(
            lambda i=i: q(w, importance=i),
            quantrs.InvalidArgument,
            f"importance[9] is {shown}",
            "expected finite and >= 0",
        )
    raises(lambda: q(w, importance=imp[:255]), quantrs.DimensionMismatch, "importance", "[256]")
    raises(lambda: q(w, importance=imp[None]), quantrs.DimensionMismatch, "importance", "[256]")
    raises(lambda: q(w, importance=imp.astype(np.complex64)), TypeError, "importance")


def _capped_threads() -> set[str]:
    names = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
        if name.startswith("quantrs-cap-"):
            names.add(name)
    return names


@pytest.mark.parametrize("name", QUANTIZERS)
def test_the_thread_cap_applies_and_leaves_the_bytes(name):
    w = np.random.default_rng(3).standard_normal((64, 512)).astype(np.float32)
    imp = np.random.default_rng(4).uniform(0, 2, 512).astype(np.float32)

    def parts(g):
        if isinstance(g, GgufWeight):
            return [np.asarray(g.to_bytes())]
        return [np.asarray(g.codes()), np.asarray(g.dequantize())]

    free = parts(QUANTIZERS[name](w, importance=imp))
    for cap in (1, 2):
        with quantrs.threads(cap):
            for a, b in zip(parts(QUANTIZERS[name](w, importance=imp)), free):
                np.testing.assert_array_equal(a, b)
    if os.path.isdir("/proc/self/task") and len(os.sched_getaffinity(0)) > 1:
        # Under a cap below the cores the rows run in a pool of the cap's size.
        with quantrs.threads(1):
            QUANTIZERS[name](w)
            assert _capped_threads() == {"quantrs-cap-0"}


def _capped_cpu_ticks() -> int:
    """CPU time (clock ticks: utime + stime) so far of the ``quantrs-cap-*`` threads."""
    ticks = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("quantrs-cap-"):
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])  # fields 14, 15 of proc(5)
    return ticks


# The other two float quantizers; each call about 0.1-0.2 s of CPU on a Zen 3 core.
OTHER_QUANTIZERS = {
    "int4 search": (
        lambda w: quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.T)),
        lambda q: [np.asarray(q.dequantize())],
        (256, 2048),
    ),
    "int_zp": (
        lambda w: quantrs.IntZpWeight.quantize(w, group_size=64),
        lambda q: [np.asarray(q.dequantize())],
        (4096, 2048),
    ),
}


@pytest.mark.parametrize("name", OTHER_QUANTIZERS)
def test_the_thread_cap_applies_to_int4_and_int_zp(name):
    quantize, parts, shape = OTHER_QUANTIZERS[name]
    w = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    free = parts(quantize(w))
    with quantrs.threads(1):
        for a, b in zip(parts(quantize(w)), free):
            np.testing.assert_array_equal(a, b)
    if os.path.isdir("/proc/self/task") and len(os.sched_getaffinity(0)) > 1:
        # Under a cap of one the rows run on the capped pool's one thread (not on
        # rayon's global workers): it gets most of the call's CPU time.
        with quantrs.threads(1):
            before, cpu = _capped_cpu_ticks(), time.process_time()
            quantize(w)
            spent = _capped_cpu_ticks() - before
            total = (time.process_time() - cpu) * os.sysconf("SC_CLK_TCK")
        assert spent >= 0.5 * total and spent > 0, (spent, total)
