"""The machine's memory bandwidth, measured the same way by every bench.

Two probes over a buffer far larger than the caches (1 GiB by default), on
exactly ``threads`` OS threads (default: every CPU the process may use), each
streaming its own contiguous slice; they run in the extension
(``quantrs._core._bandwidth_probe``, GIL released) because NumPy's
reductions are compute-bound well below DRAM speed on these machines (a
single-threaded ``uint64`` OR-reduce or float32 ``sum`` reads 8-12 GB/s where
a 4-accumulator Rust loop is bound by memory):

- ``read``: a sum of the buffer's ``uint64`` words, a few adds per 64-byte
  line: the rate at which the cores pull the buffer from DRAM, the number a
  batch-1 kernel (which reads each weight byte once) is compared with;
- ``triad``: STREAM's ``a = b + 3 c`` in float32 over three thirds of the
  buffer, counted as STREAM counts it, 3 x 4 bytes per element (the
  write-allocate read of ``a`` is not counted).

Each probe returns the median of ``repeat`` passes in GB/s (1e9 bytes/s) and
keeps every value it measured, so a bench can take a probe next to each of
its timings (on a shared or virtual machine the rate drifts within a minute)
and report kernels as a fraction of the probe taken under the same
conditions. ``python benches/_bandwidth.py [--threads N]`` prints three of
each.
"""

from __future__ import annotations

import os
import statistics
import time


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class Bandwidth:
    """Read and triad probes over ``nbytes`` on ``threads`` threads."""

    def __init__(self, np, nbytes: int = 1 << 30, threads: int | None = None) -> None:
        from quantrs import _core

        self._probe = _core._bandwidth_probe
        self.threads = threads or default_threads()
        self.read_values: list[float] = []
        self.triad_values: list[float] = []
        # Each word holds two float32 1.0s: the triad reads the words as float32, and
        # integer ones would be subnormals, which Intel cores add in microcode (the
        # triad then measures the microcode, ~3 GB/s, not the memory).
        self._buf = np.full(nbytes // 8, 0x3F800000_3F800000, dtype=np.uint64)

    @property
    def kind(self) -> str:
        return f"{self.threads} threads, {self._buf.nbytes >> 20} MiB"

    def _median_gbs(self, kind: str, nbytes: int, repeat: int) -> float:
        self._probe(self._buf, kind, self.threads)  # first pass faults pages in
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self._probe(self._buf, kind, self.threads)
            times.append(time.perf_counter() - t0)
        return nbytes / statistics.median(times) / 1e9

    def read(self, repeat: int = 3) -> float:
        """Streaming read rate, GB/s."""
        gbs = self._median_gbs("read", self._buf.nbytes, repeat)
        self.read_values.append(gbs)
        return gbs

    def triad(self, repeat: int = 3) -> float:
        """STREAM triad rate, GB/s (3 x 4 bytes per float32 element)."""
        gbs = self._median_gbs("triad", (len(self._buf) // 3) * 3 * 8, repeat)
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


def bandwidth(threads: int, repeats: int = 5) -> dict:
    """One read and one triad probe on ``threads`` threads, as a dict
    (``read_GBps``, ``triad_GBps``, ``threads``, ``how``) for the optimizer benches."""
    import numpy

    bw = Bandwidth(numpy, threads=threads)
    return {
        "read_GBps": bw.read(repeats),
        "triad_GBps": bw.triad(repeats),
        "threads": bw.threads,
        "how": f"quantrs._core._bandwidth_probe, {bw.kind}",
    }


if __name__ == "__main__":
    import argparse

    import numpy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, help="default: every CPU")
    bw = Bandwidth(numpy, threads=ap.parse_args().threads)
    for _ in range(3):
        print(f"read {bw.read():.1f} GB/s, triad {bw.triad():.1f} GB/s ({bw.kind})")
