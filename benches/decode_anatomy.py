"""Where the batch-1 INT4 linears of a decode step spend their time, per layer shape.

``bench_decode.py`` reports one number per variant: the linears' time. This script splits
it. The linears of ``--layers`` distinct layers (q/k/v/o 4096x4096, gate/up 4096x11008, down
11008x4096, INT4 at ``--group-size``; 126 MB per g32 layer, several times the last-level
cache, so every call streams its weight from DRAM) run in the decode order, one pass per step,
in these modes:

- ``back-to-back``: nothing between the calls;
- ``numpy-between``: a NumPy 4096x4096 float32 GEMV before every call (OpenBLAS's workers
  then spin while our kernel runs, as in a user's loop);
- ``foreign-threads-1``: the same under ``quantrs.foreign_threads(1)``.

each on every core and under ``quantrs.threads(1)``. Per mode: each shape's median time per
call and its weight bytes per second; and from the threads' own accounting in Linux's
``/proc/self/task/*/schedstat`` (CPU time, time waiting runnable for a CPU), summed over the
calls: the calling thread's CPU time, the helpers' share of all the kernel CPU time (a half
on 2 cores when helpers join at once), the run-queue delay of caller and helpers (the cores
were busy with something else: other processes, or OpenBLAS's spinners), and the caller's
idle wait (wall time minus its CPU time minus its run-queue delay: waiting at the join for a
helper's last block). The 2-thread read probe of ``_bandwidth.py`` runs after each round.

Linux only (schedstat); the numbers on a machine shared with other jobs move with their load,
so compare the modes within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bandwidth import Bandwidth  # noqa: E402
from _common import machine_note  # noqa: E402

D, FF = 4096, 11008
PROJ = ("q", "k", "v", "o", "gate", "up", "down")
SHAPES = {"q": (D, D), "gate": (D, FF), "down": (FF, D)}  # (in, out) of each kind of linear
MODES = ("back-to-back", "numpy-between", "foreign-threads-1")


def in_out(name: str) -> tuple[int, int]:
    if name in ("gate", "up"):
        return D, FF
    if name == "down":
        return FF, D
    return D, D


def schedstat() -> dict[int, tuple[int, int]]:
    """Per thread of this process: (CPU ns, run-queue wait ns)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
        except OSError:
            continue
        out[int(tid)] = (int(cpu), int(wait))
    return out


def anon_huge_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run_mode(np, quantrs, weights, xs, gemv, mode: str, steps: int) -> dict:
    me = threading.get_native_id()
    per = {n: [] for n in PROJ}
    cpu = {"caller": 0, "helpers": 0, "caller_wait": 0, "helper_wait": 0}
    wall_ns = 0
    cap = quantrs.foreign_threads(1) if mode == "foreign-threads-1" else None
    try:
        for _ in range(steps):
            for layer in weights:
                for n in PROJ:
                    qw = layer[n]
                    if mode != "back-to-back":
                        gemv()
                    s0 = schedstat()
                    t0 = time.perf_counter_ns()
                    qw.matvec(xs[qw.in_feat])
                    dt = time.perf_counter_ns() - t0
                    s1 = schedstat()
                    per[n].append(dt)
                    wall_ns += dt
                    for tid, (c, w) in s1.items():
                        c0, w0 = s0.get(tid, (0, 0))
                        if tid == me:
                            cpu["caller"] += c - c0
                            cpu["caller_wait"] += w - w0
                        else:
                            # Every other thread's CPU time in the call: quantrs's
                            # helpers, and OpenBLAS's spinners when they run.
                            cpu["helpers"] += c - c0
                            cpu["helper_wait"] += w - w0
    finally:
        if cap is not None:
            cap.restore()
    row = {}
    for kind in SHAPES:
        med = statistics.median(per[kind])
        row[kind] = (med / 1e6, weights[0][kind].nbytes / med)
    total_bytes = sum(layer[n].nbytes for layer in weights for n in PROJ) * steps
    kernel_cpu = cpu["caller"] + cpu["helpers"]
    row["GB/s"] = total_bytes / wall_ns
    row["cpu/wall"] = kernel_cpu / wall_ns
    row["helper share"] = cpu["helpers"] / kernel_cpu if kernel_cpu else 0.0
    row["caller runq"] = cpu["caller_wait"] / wall_ns
    row["helper runq"] = cpu["helper_wait"] / wall_ns
    row["caller idle"] = max(0, wall_ns - cpu["caller"] - cpu["caller_wait"]) / wall_ns
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=1, help="distinct layers (default 1)")
    ap.add_argument("--group-size", type=int, default=32, help="INT4 group size (default 32)")
    ap.add_argument("--steps", type=int, default=4, help="passes per mode and round (default 4)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every mode (default 2)")
    args = ap.parse_args()

    import numpy as np

    import quantrs

    rng = np.random.default_rng(0)
    before = anon_huge_mb()
    weights = []
    for _ in range(args.layers):
        layer = {}
        for n in PROJ:
            i, o = in_out(n)
            w = rng.standard_normal((i, o), dtype=np.float32) * np.float32(1 / np.sqrt(i))
            layer[n] = quantrs.QuantizedWeight.quantize(w, group_size=args.group_size)
            del w
        weights.append(layer)
    wbytes = sum(layer[n].nbytes for layer in weights for n in PROJ)
    huge = anon_huge_mb() - before
    xs = {k: rng.standard_normal(k).astype(np.float32) for k in (D, FF)}
    wnp = rng.standard_normal((D, D), dtype=np.float32)
    xnp = rng.standard_normal(D).astype(np.float32)

    def gemv():
        wnp @ xnp

    print(machine_note())
    print(
        f"{args.layers} layer(s), INT4 g{args.group_size}: {wbytes / 1e6:.0f} MB of weights, "
        f"{huge:.0f} MB of anonymous huge pages gained while building them"
    )
    bw = Bandwidth(np)
    cols = ("q", "gate", "down")
    head = "threads | mode | " + " | ".join(f"{c} ms (GB/s)" for c in cols)
    head += " | all GB/s | cpu/wall | helper share | caller runq | helper runq | caller idle"
    for r in range(args.rounds):
        print(f"\nround {r + 1}, load average {os.getloadavg()[0]:.1f}")
        print(head)
        for threads in (None, 1):
            with quantrs.threads(threads):
                for mode in MODES:
                    row = run_mode(np, quantrs, weights, xs, gemv, mode, args.steps)
                    cells = [f"{row[c][0]:.2f} ({row[c][1]:.1f})" for c in cols]
                    cells += [f"{row['GB/s']:.1f}", f"{row['cpu/wall']:.2f}"]
                    cells += [f"{row[k]:.2f}" for k in ("helper share", "caller runq")]
                    cells += [f"{row[k]:.2f}" for k in ("helper runq", "caller idle")]
                    print(f"{threads or 'all'} | {mode} | " + " | ".join(cells))
        print(f"read probe {bw.read():.1f} GB/s ({bw.kind})")


if __name__ == "__main__":
    main()
