"""Shared benchmark plumbing: timing, the OpenBLAS environment, tables.

Every bench script exposes ``run(quick: bool) -> list[dict]``; each row has at
least ``bench``, ``ours_ms``, ``baseline``, ``baseline_ms`` and ``ratio``
(baseline time / our time, so > 1 means quantrs is faster).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable

# Some machines here set these to work around old OpenBLAS bugs; they slow a
# current NumPy, and the baseline should be NumPy at its best.
_OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def reexec_without_openblas_overrides() -> None:
    """Re-run this script without the OpenBLAS overrides (before NumPy loads)."""
    if any(k in os.environ for k in _OPENBLAS_OVERRIDES) and "--keep-env" not in sys.argv:
        env = {k: v for k, v in os.environ.items() if k not in _OPENBLAS_OVERRIDES}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def call_seconds(
    fn: Callable[[], object],
    repeat: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn`` on ``clock``, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def median_ms(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    return 1e3 * statistics.median(call_seconds(fn, repeat, warmup))


def paired_ms(
    baseline: Callable[[], object],
    ours: Callable[[], object],
    pairs: int,
    inner: int,
    after_ours: Callable[[float], object] | None = None,
) -> tuple[float, float, float]:
    """Alternate the baseline and our kernel `pairs` times (each timed as the
    median of `inner` calls, with the OpenBLAS settle in between) and return
    (baseline ms, our ms, ratio): the medians of each and the median of the
    per-pair ratios. On a shared or virtual machine whose speed drifts, the
    paired ratio compares the two under the same conditions. `after_ours`,
    if given, is called with our time of each pair right after it is taken
    (to measure something else under the same conditions)."""
    base_t, ours_t, ratios = [], [], []
    for _ in range(pairs):
        warm(baseline, 0.1)
        b = median_ms(baseline, inner, warmup=0)
        # Instead of sleeping while OpenBLAS's spinning thread winds down
        # (an idle virtual CPU comes back slow for tens of ms), run our own
        # kernel for the same time: it settles both and warms our path.
        warm(ours, 0.25)
        o = median_ms(ours, inner, warmup=0)
        if after_ours is not None:
            after_ours(o)
        base_t.append(b)
        ours_t.append(o)
        ratios.append(b / o)
    return statistics.median(base_t), statistics.median(ours_t), statistics.median(ratios)


def warm(fn: Callable[[], object], seconds: float) -> None:
    """Call `fn` repeatedly for about `seconds` (at least once)."""
    end = time.perf_counter() + seconds
    fn()
    while time.perf_counter() < end:
        fn()


def settle() -> None:
    """OpenBLAS keeps a thread spinning ~0.1 s after a call; let it stop."""
    time.sleep(0.25)


def print_table(rows: list[dict], columns: list[str]) -> None:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))


def emit(rows: list[dict], columns: list[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows, columns)


def machine_note() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"cores: {os.cpu_count()}, load average (1 min) before the run: {load:.2f}"
