"""Helpers shared by the Python tests: seeded random arrays and the check
that a kernel call releases the GIL."""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np


def rand(shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 values times `scale`, reproducible from `seed`."""
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def assert_gil_released(work: Callable[[], object]) -> None:
    """Run `work` (one or a few long kernel calls) in a worker thread while
    this thread keeps stamping the clock: with the GIL held for the call, no
    bytecode of this thread could run between the worker entering and
    leaving the kernel, so the middle half of that window would hold no
    stamps."""
    window: list[float] = []
    stamps: list[float] = []
    started = threading.Event()

    def run() -> None:
        started.set()
        t0 = time.perf_counter()
        work()
        window.extend([t0, time.perf_counter()])

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    while t.is_alive():
        stamps.append(time.perf_counter())
    t.join()
    t0, t1 = window
    assert t1 - t0 > 0.02, "kernel too short to tell"
    inside = [s for s in stamps if t0 + 0.25 * (t1 - t0) < s < t1 - 0.25 * (t1 - t0)]
    assert len(inside) > 100, (len(inside), t1 - t0)
