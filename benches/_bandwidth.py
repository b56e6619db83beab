"""The machine's memory bandwidth, measured the same way by every bench.

Two probes over buffers far larger than the caches, each on ``threads``
Python threads (default: every CPU the process may use), each thread working
on its own contiguous slice with NumPy ufuncs, which release the GIL inside
their loops, so the slices are streamed in parallel:

- ``read``: ``np.bitwise_or.reduce`` of a ``uint64`` slice. A vectorised
  integer reduction costs far less than a load per element, so the rate is
  the rate at which the cores can pull the buffer from DRAM (the number a
  batch-1 kernel, which reads each weight byte once, is compared with).
- ``triad``: STREAM's ``a = b + s * c`` in float32, done per cache-sized
  chunk (``s * c`` into a thread-local scratch that stays in L2, then
  ``b + scratch`` into ``a``), so DRAM sees the same traffic as STREAM's
  triad: two streams read, one written. Counted, as STREAM counts it, as
  3 x 4 bytes per element (the write-allocate read of ``a`` is not counted).

Each probe returns the median of ``repeat`` passes in GB/s (1e9 bytes/s) and
keeps every value it measured, so a bench can take a probe next to each of
its timings (on a shared or virtual machine the rate drifts within a minute)
and report kernels as a fraction of the probe taken under the same
conditions. The same code path runs whatever extension build is installed:
a probe that changed with the build would not compare across runs.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

# Triad works per chunk of this many elements (1 MiB of float32 scratch per
# thread: inside a Zen 4 core's L2).
_CHUNK = 1 << 18


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Bandwidth:
    """Read and triad probes over ``nbytes`` per buffer on ``threads`` threads."""

    def __init__(self, np, nbytes: int = 1 << 30, threads: int | None = None) -> None:
        self.np = np
        self.threads = threads or default_threads()
        self.read_values: list[float] = []
        self.triad_values: list[float] = []
        self._buf = np.ones(nbytes // 8, dtype=np.uint64)
        self._read_slices = np.array_split(self._buf, self.threads)
        self._pool = ThreadPoolExecutor(max_workers=self.threads)
        self._triad: tuple | None = None
        self._triad_bytes = nbytes // 3

    @property
    def kind(self) -> str:
        return f"numpy, {self.threads} threads, {self._buf.nbytes >> 20} MiB"

    def _median_gbs(self, fn, nbytes: int, repeat: int) -> float:
        fn()  # touch (first pass faults pages in, warms the pool)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9

    def read(self, repeat: int = 3) -> float:
        """Streaming read rate, GB/s."""
        reduce = self.np.bitwise_or.reduce
        gbs = self._median_gbs(
            lambda: list(self._pool.map(reduce, self._read_slices)), self._buf.nbytes, repeat
        )
        self.read_values.append(gbs)
        return gbs

    def triad(self, repeat: int = 3) -> float:
        """STREAM triad rate, GB/s (3 x 4 bytes per element)."""
        np = self.np
        if self._triad is None:
            n = self._triad_bytes // 4
            a, b, c = (np.ones(n, dtype=np.float32) for _ in range(3))
            parts = [
                (a[s], b[s], c[s], np.empty(_CHUNK, dtype=np.float32))
                for s in _slices(n, self.threads)
            ]
            self._triad = (a, parts)
        a, parts = self._triad
        scalar = np.float32(3)

        def one(part) -> None:
            pa, pb, pc, tmp = part
            for lo in range(0, len(pa), _CHUNK):
                hi = min(lo + _CHUNK, len(pa))
                t = tmp[: hi - lo]
                np.multiply(pc[lo:hi], scalar, out=t)
                np.add(pb[lo:hi], t, out=pa[lo:hi])

        gbs = self._median_gbs(lambda: list(self._pool.map(one, parts)), 3 * a.nbytes, repeat)
        self.triad_values.append(gbs)
        return gbs

    def summary(self) -> dict:
        """Medians of every probe taken (NaN where none was)."""

        def med(v: list[float]) -> float:
            return statistics.median(v) if v else float("nan")

        return {
            "read_GB/s": med(self.read_values),
            "triad_GB/s": med(self.triad_values),
            "probe": self.kind,
        }


def _slices(n: int, parts: int) -> list[slice]:
    step = -(-n // parts)
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


if __name__ == "__main__":
    import numpy

    bw = Bandwidth(numpy)
    for _ in range(3):
        print(f"read {bw.read():.1f} GB/s, triad {bw.triad():.1f} GB/s ({bw.kind})")
