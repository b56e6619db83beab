"""quantrs.threads / num_threads (the small-batch kernels' thread cap) and
the benches' bandwidth probe (docs/int4.md, "Threads")."""

from __future__ import annotations

import os

import numpy as np
import pytest

import quantrs
from quantrs import _core


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_cap_applies_at_once_and_the_context_manager_restores_it():
    assert quantrs.num_threads() == cores()
    with quantrs.threads(1) as t:
        assert quantrs.num_threads() == 1
        with quantrs.threads(None):
            assert quantrs.num_threads() == cores()
        assert quantrs.num_threads() == 1
        t.restore()  # restoring twice is harmless: __exit__ does nothing more
    assert quantrs.num_threads() == cores()
    t = quantrs.threads(1)
    assert quantrs.num_threads() == 1
    t.restore()
    assert quantrs.num_threads() == cores()
    with quantrs.threads(10_000):
        assert quantrs.num_threads() == cores()  # no more than the cores


@pytest.mark.parametrize("n", [0, -1])
def test_a_bad_count_raises_and_leaves_the_cap(n):
    with pytest.raises(quantrs.InvalidArgument, match=r"n: expected an int in \[1, "):
        quantrs.threads(n)
    assert quantrs.num_threads() == cores()
    with pytest.raises(TypeError):
        quantrs.threads("2")
    assert quantrs.num_threads() == cores()


@pytest.mark.parametrize("batch", [1, 4])
def test_results_do_not_depend_on_the_cap(batch):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((512, 384), dtype=np.float32)
    x = rng.standard_normal((batch, 512), dtype=np.float32)
    qw = quantrs.QuantizedWeight.quantize(w, group_size=32, method="rtn")
    free = qw.matmul(x)
    with quantrs.threads(1):
        capped = qw.matmul(x)
        capped_a8 = qw.matmul(x, activations="int8")
    np.testing.assert_array_equal(capped, free)
    np.testing.assert_array_equal(capped_a8, qw.matmul(x, activations="int8"))
    ref = x.astype(np.float64) @ qw.dequantize().astype(np.float64)
    np.testing.assert_allclose(capped, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_bandwidth_probe_reads_and_writes_what_numpy_computes(threads):
    rng = np.random.default_rng(5)
    buf = rng.integers(0, 2**63, size=3 * 1001, dtype=np.uint64)
    want = int(buf.sum(dtype=np.uint64))  # NumPy's uint64 sum wraps the same way
    assert _core._bandwidth_probe(buf, "read", threads) == want
    f = np.abs(rng.standard_normal(2 * len(buf), dtype=np.float32)).view(np.uint64)
    third = len(f) // 3
    b, c = f[third : 2 * third].view(np.float32), f[2 * third :].view(np.float32)
    expect = b + np.float32(3) * c
    assert _core._bandwidth_probe(f, "triad", threads) == 0
    np.testing.assert_array_equal(f[:third].view(np.float32), expect)


def test_bandwidth_probe_rejects_bad_arguments():
    buf = np.zeros(8, dtype=np.uint64)
    with pytest.raises(quantrs.InvalidArgument, match="kind: expected 'read' or 'triad'"):
        _core._bandwidth_probe(buf, "copy", 1)
    with pytest.raises(quantrs.InvalidArgument, match=r"threads: expected an int in \[1, "):
        _core._bandwidth_probe(buf, "read", 0)
