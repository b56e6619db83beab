"""AdamW4bit benchmark (SPEC section 9): one optimizer step on a single float32 parameter of
2^24 elements against a vectorized NumPy float32 AdamW measured in the same run (and PyTorch's
fused AdamW when torch happens to be installed), state bytes per parameter, and the convergence
table of the v maps and m methods against the float32 oracle.

Run: python benches/bench_optim.py [--log2n 24] [--repeats 7] [--threads N] [--no-convergence]
(--threads sets RAYON_NUM_THREADS for quantrs; NumPy's element-wise ops are single-threaded.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# NumPy's element-wise AdamW is single-threaded; an idle OpenBLAS pool would still spin on a
# core after BLAS-using setup calls and steal it from the kernel timed next (PEERS.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import quantrs
from quantrs.reference import optim as R


def numpy_adamw_step(w, g, m, v, tmp, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """Float32 AdamW with plain in-place NumPy ops (the PEERS.md baseline)."""
    f = np.float32
    m *= f(b1)
    np.multiply(g, f(1 - b1), out=tmp)
    m += tmp
    v *= f(b2)
    np.multiply(g, g, out=tmp)
    tmp *= f(1 - b2)
    v += tmp
    w *= f(1 - lr * wd)
    np.divide(v, f(1 - b2**t), out=tmp)
    np.sqrt(tmp, out=tmp)
    tmp += f(eps)
    np.divide(m, tmp, out=tmp)
    tmp *= f(lr / (1 - b1**t))
    w -= tmp


def median_ms(fn, repeats, pause=0.0):
    """(median, min) wall time in ms; the min shows the uncontended speed on a busy machine."""
    times = []
    for _ in range(repeats):
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def bench_step(log2n: int, repeats: int):
    n = 1 << log2n
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n, dtype=np.float32)
    g = (rng.standard_normal(n, dtype=np.float32) * 0.01).astype(np.float32)
    rows = []

    m, v, tmp = (np.zeros(n, np.float32) for _ in range(3))
    wn = w.copy()
    state = {"t": 0}

    def np_step():
        state["t"] += 1
        numpy_adamw_step(wn, g, m, v, tmp, state["t"])

    np_step()
    np_ms = median_ms(np_step, repeats)
    rows.append(("NumPy float32 AdamW (in-place ops)", np_ms, 8.0))

    try:
        import torch  # only if already installed; never installed for this
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(quantrs.build_info()["threads"])  # the same thread count
        tw = torch.from_numpy(w.copy()).requires_grad_(True)
        tw.grad = torch.from_numpy(g.copy())
        topt = torch.optim.AdamW([tw], lr=1e-3, weight_decay=0.01, fused=True)
        topt.step()
        t_ms = median_ms(topt.step, repeats)
        rows.append((f"torch AdamW(fused=True), {torch.get_num_threads()} threads", t_ms, 8.0))

    time.sleep(0.25)  # let OpenBLAS/NumPy threads go idle
    opt = quantrs.AdamW4bit(1e-3, 0.9, 0.999, 1e-8, 0.01)
    wq = w.copy()

    def q_step():
        opt.update(wq, g)
        opt.step()

    q_step()
    q_ms = median_ms(q_step, repeats)
    mu = opt.memory_usage()
    rows.append(("quantrs AdamW4bit (defaults)", q_ms, mu.total_bytes / mu.num_parameters))

    for method in ("int8",):
        o2 = quantrs.AdamW4bit.with_quantization_config(
            quantrs.Adam4bitOptimizerConfig(1e-3, weight_decay=0.01),
            quantrs.AdvancedQuantizationConfig(method),
        )
        w2 = w.copy()

        def s2(o2=o2, w2=w2):
            o2.update(w2, g)
            o2.step()

        s2()
        ms = median_ms(s2, max(3, repeats // 2))
        mu2 = o2.memory_usage()
        rows.append(
            (f"quantrs AdamW4bit method={method}", ms, mu2.total_bytes / mu2.num_parameters)
        )

    info = quantrs.build_info()
    print(
        f"\n## Optimizer step, one float32 parameter of 2^{log2n} elements "
        f"(median of {repeats}; simd={info['simd']}, threads={info['threads']}, "
        f"cpus={os.cpu_count()}, load={os.getloadavg()[0]:.1f})\n"
    )
    print("| implementation | median ms | vs NumPy | min ms | vs NumPy (min) | bytes / param |")
    print("|---|---|---|---|---|---|")
    for name, (med, best), bpp in rows:
        print(
            f"| {name} | {med:.1f} | {np_ms[0] / med:.2f}x | {best:.1f} | {np_ms[1] / best:.2f}x "
            f"| {bpp:.3f} |"
        )
    return rows


def make(method: str, vmap: str | None, lr: float):
    q = quantrs.AdvancedQuantizationConfig(method, variance_map=vmap)
    return quantrs.AdamW4bit.with_quantization_config(quantrs.Adam4bitOptimizerConfig(lr), q)


def tracking(curve, base):
    """Mean relative gap of the loss curve to float32's (lower is better)."""
    c, b = np.asarray(curve), np.asarray(base)
    return float(np.mean(c / b - 1))


def bench_convergence(methods, vmaps):
    print("\n## Convergence vs float32 AdamW (final full loss, relative; cosine schedule)\n")
    print("Tracking = mean relative gap of the per-step training loss over the whole run.\n")
    print("| task | m method | v map | final loss | vs float32 | tracking |")
    print("|---|---|---|---|---|---|")
    results = {}
    for tname, T in R.CONVERGENCE_TASKS.items():
        steps, lr = R.CONVERGENCE_SETTINGS[tname]
        task = T()
        base_curve: list = []
        base = R.train(task, R.AdamWReference(lr), steps, lr, base_curve)
        print(f"| {tname} | float32 | - | {base:.5f} | - | - |")
        for method in methods:
            for vmap in vmaps:
                curve: list = []
                loss = R.train(task, make(method, vmap, lr), steps, lr, curve)
                tr = tracking(curve, base_curve)
                results[(tname, method, vmap)] = (loss / base - 1, tr)
                rel, trk, vm = 100 * (loss / base - 1), 100 * tr, vmap or "default"
                print(
                    f"| {tname} | {method} | {vm} | {loss:.5f} | {rel:+.2f} % | {trk:+.2f} % |",
                    flush=True,
                )
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--no-convergence", action="store_true")
    ap.add_argument("--all-maps", action="store_true", help="every method x every v map")
    ap.add_argument("--threads", type=int, default=None, help="rayon threads for quantrs")
    a = ap.parse_args()
    if a.threads:
        os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    global quantrs, R
    import quantrs as q
    from quantrs.reference import optim as r

    quantrs, R = q, r
    if not a.no_step:
        bench_step(a.log2n, a.repeats)
    if not a.no_convergence:
        vmaps = ["linear", "sqrt_linear", "log", "sqrt_log"]
        if a.all_maps:
            bench_convergence(["nf4", "int4", "dynamic", "int8"], vmaps)
        else:
            bench_convergence(["nf4"], vmaps)
            bench_convergence(["int4", "dynamic", "int8"], [None])


if __name__ == "__main__":
    main()
