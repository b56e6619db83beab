"""QatOptimizer step vs a NumPy float64 AdamW step (bar and target: docs/benchmarks.md).

Usage: python benches/bench_qat.py [--quick] [--json] [--log2n 24] [--repeats 7]

Prints median milliseconds per step and the ratio to the NumPy baseline
(> 1 means faster than NumPy): each of our steps is timed right after a NumPy
step, and the ratio is the median over those pairs, so that load changes on a
shared machine hit both sides alike. The bar: the int8
float64 step within 2x of NumPy's float64 AdamW step (ratio >= 0.5); the
goal: faster (ratio > 1). A second baseline row adds NumPy's fake
quantization (the whole QAT step in NumPy, as the reference computes it).

--quick: 2^22 elements, 3 pairs. --json: print only a JSON list of rows (the
benchmark convention, docs/cli.md): ``ratio`` is baseline_ms / ours_ms of the
medians, ``paired_ratio`` the median over the interleaved pairs (as printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import reexec_without_openblas_overrides  # noqa: E402

BASELINE = "numpy f64 AdamW"
BASELINE_QAT = "numpy f64 AdamW + int8 fake quant"


def numpy_adamw(w, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, tmp=None):
    """AdamW with plain in-place NumPy ops (one scratch buffer)."""
    import numpy as np

    m *= b1
    m += (1 - b1) * g
    v *= b2
    np.multiply(g, g, out=tmp)
    tmp *= 1 - b2
    v += tmp
    w *= 1 - lr * wd
    np.divide(v, 1 - b2**t, out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / (1 - b1**t)
    w -= tmp


def numpy_fake_int8(w, out):
    import numpy as np

    scale = np.max(np.abs(w)) / 127
    np.divide(w, scale, out=out)
    np.round(out, out=out)
    np.clip(out, -127, 127, out=out)
    out *= scale


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def measure(log2n: int, repeats: int) -> dict:
    """Time every case interleaved with the NumPy AdamW step; raw measurements."""
    import numpy as np

    import quantrs

    n = 1 << log2n
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n)
    g = rng.standard_normal(n) * 1e-3

    # NumPy state, reused by every row.
    nw = w.copy()
    m, v, tmp, q = (np.zeros(n) for _ in range(4))
    t = [0]

    def np_step():
        t[0] += 1
        numpy_adamw(nw, g, m, v, t[0], tmp=tmp)

    def np_qat_step():
        np_step()
        numpy_fake_int8(nw, q)

    cases = [
        ("NumPy float64 AdamW + int8 fake quant", None, np_qat_step),
        ("QatOptimizer int8 nearest float64", ("int8", "nearest", np.float64), None),
        ("QatOptimizer int8 stochastic float64", ("int8", "stochastic", np.float64), None),
        ("QatOptimizer int4 nearest float64", ("int4", "nearest", np.float64), None),
        ("QatOptimizer fp8_e4m3 nearest float64", ("fp8_e4m3", "nearest", np.float64), None),
        ("QatOptimizer int8 nearest float32", ("int8", "nearest", np.float32), None),
    ]
    base_all, rows = [], []
    for name, spec, fn in cases:
        if spec is not None:
            target, rounding, dtype = spec
            wt, gt = w.astype(dtype), g.astype(dtype)
            opt = quantrs.QatOptimizer(wt, quantrs.QatConfig(target, rounding=rounding), rng=0)

            def fn(opt=opt, wt=wt, gt=gt):
                opt.step(wt, gt)

        fn()  # warm up: page faults, thread pool
        np_step()
        ours, base = [], []
        # Interleave with the baseline so that load drifts hit both alike.
        for _ in range(repeats):
            base.append(timed(np_step))
            time.sleep(0.25)  # let NumPy / OpenBLAS threads go quiet
            ours.append(timed(fn))
        base_all += base
        ratio = statistics.median(b / o for b, o in zip(base, ours))
        rows.append(
            {
                "name": name,
                "spec": spec and (spec[0], spec[1], np.dtype(spec[2]).name),
                "ms": statistics.median(ours),
                "base_ms": statistics.median(base),
                "paired_ratio": ratio,
            }
        )
        fn = None
        opt = wt = gt = None

    return {
        "log2n": log2n,
        "repeats": repeats,
        "info": quantrs.build_info(),
        "base_ms": statistics.median(base_all),
        "cases": rows,
    }


def bench_rows(meas: dict) -> list[dict]:
    """One row per (QatOptimizer case, baseline) pair, in the benchmark convention."""
    threads = meas["info"]["threads"]
    np_qat = next(c for c in meas["cases"] if c["spec"] is None)
    rows = []
    for c in meas["cases"]:
        if c["spec"] is None:
            continue
        target, rounding, dtype = c["spec"]
        bench = f"QatOptimizer step 2^{meas['log2n']} {target} {rounding} {dtype}"
        rows.append(
            {
                "bench": bench,
                "ours_ms": c["ms"],
                "baseline": BASELINE,
                "baseline_ms": c["base_ms"],
                "ratio": c["base_ms"] / c["ms"],
                "paired_ratio": c["paired_ratio"],
                "threads": threads,
            }
        )
        if target == "int8" and dtype == "float64":
            # the whole QAT step in NumPy (timed in its own interleaved run)
            rows.append(
                {
                    "bench": bench,
                    "ours_ms": c["ms"],
                    "baseline": BASELINE_QAT,
                    "baseline_ms": np_qat["ms"],
                    "ratio": np_qat["ms"] / c["ms"],
                    "threads": threads,
                }
            )
    return rows


def print_table(meas: dict) -> None:
    info = meas["info"]
    print(
        f"QatOptimizer step, n = 2^{meas['log2n']}, median of {meas['repeats']} interleaved "
        f"pairs; simd={info['simd']}, threads={info['threads']}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"| {'implementation':<42} | {'ms':>8} | {'vs NumPy AdamW':>14} |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 16}|")
    print(f"| {'NumPy float64 AdamW (baseline)':<42} | {meas['base_ms']:8.1f} | {1:13.2f}x |")
    for c in meas["cases"]:
        print(f"| {c['name']:<42} | {c['ms']:8.1f} | {c['paired_ratio']:13.2f}x |")


def run(
    quick: bool = False,
    log2n: int | None = None,
    repeats: int | None = None,
    verbose: bool = False,
) -> list[dict]:
    """Rows in the benchmark convention (docs/cli.md); prints the table when ``verbose``."""
    log2n = log2n if log2n is not None else (22 if quick else 24)
    repeats = repeats if repeats is not None else (3 if quick else 7)
    meas = measure(log2n, repeats)
    if verbose:
        print_table(meas)
    return bench_rows(meas)


def main():
    reexec_without_openblas_overrides()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2^22 elements, 3 pairs")
    ap.add_argument("--json", action="store_true", help="print only a JSON list of rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    ap.add_argument("--log2n", type=int, default=None, help="default 24 (--quick: 22)")
    ap.add_argument("--repeats", type=int, default=None, help="default 7 (--quick: 3)")
    args = ap.parse_args()
    rows = run(args.quick, log2n=args.log2n, repeats=args.repeats, verbose=not args.json)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
