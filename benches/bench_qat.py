"""QatOptimizer step vs a NumPy float64 AdamW step (SPEC section 9).

Usage: python benches/bench_qat.py [--log2n 24] [--repeats 5]

Prints median milliseconds per step and the ratio to the NumPy baseline
measured in the same run (> 1 means faster than NumPy). The bar: the int8
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


def median_ms(fn, repeats):
    fn()  # warm up (page faults, thread pool)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def numpy_rows(w, g, n, repeats):
    """Baseline timings on a copy of ``w`` (the arrays are freed on return)."""
    w = w.copy()
    m, v, tmp, q = (np.zeros(n) for _ in range(4))
    t = [0]

    def np_step():
        t[0] += 1
        numpy_adamw(w, g, m, v, t[0], tmp=tmp)

    def np_qat_step():
        np_step()
        numpy_fake_int8(w, q)

    return [
        ("NumPy float64 AdamW (baseline)", median_ms(np_step, repeats)),
        ("NumPy float64 AdamW + int8 fake quant", median_ms(np_qat_step, repeats)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n)
    g = rng.standard_normal(n) * 1e-3

    rows = numpy_rows(w, g, n, args.repeats)
    base = rows[0][1]

    cases = [
        ("int8", "nearest", np.float64),
        ("int8", "stochastic", np.float64),
        ("int4", "nearest", np.float64),
        ("fp8_e4m3", "nearest", np.float64),
        ("int8", "nearest", np.float32),
    ]
    for target, rounding, dtype in cases:
        wt = w.astype(dtype)
        gt = g.astype(dtype)
        opt = quantrs.QatOptimizer(wt, quantrs.QatConfig(target, rounding=rounding), rng=0)
        time.sleep(0.25)  # let OpenBLAS / NumPy threads go quiet
        ms = median_ms(lambda opt=opt, wt=wt, gt=gt: opt.step(wt, gt), args.repeats)
        name = f"QatOptimizer {target} {rounding} {np.dtype(dtype).name}"
        rows.append((name, ms))
        del opt, wt, gt

    info = quantrs.build_info()
    print(
        f"QatOptimizer step, n = 2^{args.log2n}, median of {args.repeats}; "
        f"simd={info['simd']}, threads={info['threads']}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"| {'implementation':<42} | {'ms':>8} | {'vs NumPy AdamW':>14} |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 16}|")
    for name, ms in rows:
        print(f"| {name:<42} | {ms:8.1f} | {base / ms:13.2f}x |")


if __name__ == "__main__":
    main()
