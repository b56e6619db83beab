"""QatOptimizer step vs a NumPy float64 AdamW step (SPEC section 9).

Usage: python benches/bench_qat.py [--log2n 24] [--repeats 7]

Prints median milliseconds per step and the ratio to the NumPy baseline
(> 1 means faster than NumPy): each of our steps is timed right after a NumPy
step, and the ratio is the median over those pairs, so that load changes on a
shared machine hit both sides alike. The bar: the int8
float64 step within 2x of NumPy's float64 AdamW step (ratio >= 0.5); the
goal: faster (ratio > 1). A second baseline row adds NumPy's fake
quantization (the whole QAT step in NumPy, as the reference computes it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import quantrs


def numpy_adamw(w, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, tmp=None):
    """AdamW with plain in-place NumPy ops (one scratch buffer)."""
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
    scale = np.max(np.abs(w)) / 127
    np.divide(w, scale, out=out)
    np.round(out, out=out)
    np.clip(out, -127, 127, out=out)
    out *= scale


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = 1 << args.log2n
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
        for _ in range(args.repeats):
            base.append(timed(np_step))
            time.sleep(0.25)  # let NumPy / OpenBLAS threads go quiet
            ours.append(timed(fn))
        base_all += base
        ratio = statistics.median(b / o for b, o in zip(base, ours))
        rows.append((name, statistics.median(ours), ratio))
        fn = None
        opt = wt = gt = None

    info = quantrs.build_info()
    print(
        f"QatOptimizer step, n = 2^{args.log2n}, median of {args.repeats} interleaved pairs; "
        f"simd={info['simd']}, threads={info['threads']}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"| {'implementation':<42} | {'ms':>8} | {'vs NumPy AdamW':>14} |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 16}|")
    base_ms = statistics.median(base_all)
    print(f"| {'NumPy float64 AdamW (baseline)':<42} | {base_ms:8.1f} | {1:13.2f}x |")
    for name, ms, ratio in rows:
        print(f"| {name:<42} | {ms:8.1f} | {ratio:13.2f}x |")


if __name__ == "__main__":
    main()
