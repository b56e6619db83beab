"""quantrs.foreign_threads: the BLAS / OpenMP pools capped around a decode loop
(docs/int4.md, "Threads"), read back through threadpoolctl's own report."""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import quantrs


def pool_threads(api: str) -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == api]


def test_the_cap_applies_at_once_and_the_context_manager_restores_it():
    blas = pool_threads("blas")
    assert blas, "NumPy's BLAS is not visible to threadpoolctl"
    with quantrs.foreign_threads() as cap:
        assert pool_threads("blas") == [1] * len(blas)
        assert repr(cap) == "quantrs.foreign_threads(1)"
    assert pool_threads("blas") == blas
    cap = quantrs.foreign_threads(1, user_api="blas")
    assert pool_threads("blas") == [1] * len(blas)
    cap.restore()
    assert pool_threads("blas") == blas


def test_the_openmp_pool_of_torch_is_capped_too():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    with quantrs.foreign_threads(1, user_api="openmp"):
        assert set(pool_threads("openmp")) == {1}
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def test_no_blas_thread_is_left_spinning_under_the_cap():
    """Without the cap, OpenBLAS's workers spin for ~0.1 s after a threaded GEMV (on an idle
    2-core machine that is ~0.1 CPU-seconds during the sleep below); under it none is woken."""
    w = np.ones((2048, 2048), np.float32)
    x = np.ones(2048, np.float32)
    with quantrs.foreign_threads():
        time.sleep(0.25)  # a spin left by an earlier test times out
        y = w @ x
        t0 = cpu_seconds()
        time.sleep(0.2)
        spun = cpu_seconds() - t0
    assert y[0] == 2048.0
    assert spun < 0.02, f"{spun:.3f} CPU-seconds burnt while the process slept"


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((0,), {}, quantrs.InvalidArgument, r"n: expected >= 1, got 0"),
        ((-2,), {}, quantrs.InvalidArgument, r"n: expected >= 1, got -2"),
        ((1.5,), {}, TypeError, r"n: expected an int >= 1, got float"),
        ((True,), {}, TypeError, r"n: expected an int >= 1, got bool"),
        ((1,), {"user_api": "cuda"}, quantrs.InvalidArgument, r"user_api: expected None"),
    ],
)
def test_bad_arguments_raise_and_change_no_pool(args, kwargs, error, match):
    before = threadpool_info()
    with pytest.raises(error, match=match):
        quantrs.foreign_threads(*args, **kwargs)
    assert threadpool_info() == before
