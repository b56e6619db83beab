"""Helpers shared by the Python tests: seeded random arrays and the check
that a kernel call releases the GIL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a child of a large
# pytest process would report the parent's peak; VmHWM belongs to the new address space.
_PEAK_SCRIPT = textwrap.dedent(
    """
    import sys
    from quantrs.cli import main
    argv = sys.argv[1:]
    rc = main(argv) if argv else 0
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    print(int(hwm.split()[1]) * 1024)
    sys.exit(rc)
    """
)


def peak_rss(*argv: str) -> int:
    """Peak resident bytes of a fresh interpreter running ``quantrs <argv>`` (none: bare)."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, *argv], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])
