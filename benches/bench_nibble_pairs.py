"""Batch-1 / batch-16 ``matmul`` of the nibble and zero-point formats (``int4_asym`` g32 and
g128, ``int4_k``, ``int_zp`` 4-bit and 8-bit g128) against INT4 g32 on the same ``[out, in]``
weight, in this build and in another (``--baseline-build DIR``, a copy of a built
``python/quantrs``), all in one process on one thread, timed in process CPU time (the
machine this was written on is shared: wall time drifts with the other jobs, CPU time much
less) and alternating, build against build, ``--pairs`` times. Per format it prints each
build's time and per-byte ratio (INT4 g32's time per weight byte over the format's, INT4
timed in the same build: the issue's bar is >= 0.83) and the median of the pairs' speed
ratios, build against baseline (> 1: this build is faster).
Run: ``python benches/bench_nibble_pairs.py --baseline-build DIR [--shapes 576x1536,...]
[--batches 1,16] [--pairs 7]``."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from bench_int4_asym import load_build


def cases(q, w: np.ndarray) -> dict:
    """The weights to time, made by the build ``q`` from ``w`` ``[out, in]``."""
    c = {"int4 g32": q.QuantizedWeight.quantize(np.ascontiguousarray(w.T), group_size=32)}
    for g in (32, 128):
        c[f"int4_asym g{g}"] = q.Int4AsymWeight.quantize(w, group_size=g, method="rtn")
    c["int4_k"] = q.Int4KWeight.quantize(w, method="rtn")
    c["int_zp 4-bit g128"] = q.IntZpWeight.quantize(w, group_size=128)
    c["int_zp 8-bit g128"] = q.IntZpWeight.quantize(w, group_size=128, bits=8)
    return c


def cpu_ms(f, x: np.ndarray, n: int) -> float:
    """Process CPU ms per call of ``f(x)`` over ``n`` calls, after one warm call."""
    f(x)
    t = time.process_time()
    for _ in range(n):
        f(x)
    return (time.process_time() - t) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--baseline-build", required=True, metavar="DIR", help="a copy of a built python/quantrs"
    )
    p.add_argument("--shapes", default="576x1536,1536x576,576x576,576x192,4096x4096")
    p.add_argument("--batches", default="1,16", help="comma-separated batch sizes (1,16)")
    p.add_argument("--pairs", type=int, default=7, help="alternated pairs per case (7)")
    a = p.parse_args()
    import quantrs as new

    base = load_build(a.baseline_build)
    for q in (new, base):
        q.threads(1)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    pairs = a.pairs
    print("load average before:", os.getloadavg())
    rng = np.random.default_rng(0)
    for out, inf in shapes:
        w = rng.standard_normal((out, inf)).astype(np.float32)
        cb, cn = cases(base, w), cases(new, w)
        int4_bytes = out * inf // 2 + out * inf // 32 * 4
        nbytes = {k: int4_bytes if k == "int4 g32" else v.nbytes for k, v in cn.items()}
        for b in batches:
            x = rng.standard_normal((b, inf)).astype(np.float32)
            n = max(3, int(2e7 / (out * inf * max(1, b // 4))))
            res: dict[str, tuple[list, list]] = {k: ([], []) for k in cn}
            for _ in range(pairs):
                for k in cn:
                    res[k][0].append(cpu_ms(cb[k].matmul, x, n))
                    res[k][1].append(cpu_ms(cn[k].matmul, x, n))
            i4 = [statistics.median(v) / int4_bytes for v in res["int4 g32"]]
            for k, (tb, tn) in res.items():
                mb, mn = statistics.median(tb), statistics.median(tn)
                line = f"[{out}x{inf}] b{b} {k:18s} base {mb:.4f} ms  new {mn:.4f} ms"
                if k != "int4 g32":
                    pb, pn = i4[0] / (mb / nbytes[k]), i4[1] / (mn / nbytes[k])
                    speed = statistics.median(a / c for a, c in zip(tb, tn))
                    line += f"  per-byte base {pb:.2f} new {pn:.2f}  new/base {speed:.2f}"
                print(line)
    print("load average after:", os.getloadavg())


if __name__ == "__main__":
    main()
