"""The machine's memory bandwidth, measured the same way by every bench that reports a
kernel as a fraction of it: STREAM-style read (a sum) and triad (``a = b + s * c``) over
float32 arrays of 2^25 elements (128 MiB each, far above the last-level cache), with
torch's parallel kernels on ``threads`` threads when torch is importable, else NumPy (one
thread). The best of ``repeats`` runs, in GB/s (10^9 bytes per second); a triad moves
12 bytes per element (two reads and a write; the write-allocate read is not counted, as
STREAM does not count it).
"""

from __future__ import annotations

import time

N = 1 << 25


def _best_s(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth(threads: int, repeats: int = 5) -> dict:
    """``{"read_GBps", "triad_GBps", "threads", "how"}`` for this machine."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            a, b, c = (torch.ones(N) for _ in range(3))
            read = _best_s(lambda: float(b.sum()), repeats)
            triad = _best_s(lambda: torch.add(b, c, alpha=3.0, out=a), repeats)
        finally:
            torch.set_num_threads(old)
        how = f"torch sum / add(out=), {threads} threads"
    else:
        import numpy as np

        a, b, c = (np.ones(N, np.float32) for _ in range(3))

        def triad_np():
            np.multiply(c, np.float32(3.0), out=a)
            np.add(a, b, out=a)

        read = _best_s(lambda: float(b.sum()), repeats)
        # Two passes move 20 bytes per element: scaled so the figure is bytes moved per second.
        triad = _best_s(triad_np, repeats) * 12 / 20
        how = "numpy sum / multiply+add, 1 thread"
        threads = 1
    return {
        "read_GBps": 4 * N / read / 1e9,
        "triad_GBps": 12 * N / triad / 1e9,
        "threads": threads,
        "how": how,
    }
