"""AdamW4bit benchmark (docs/benchmarks.md): one optimizer step on a single float32 parameter of
2^24 elements against a vectorized NumPy float32 AdamW measured in the same run (and PyTorch's
fused AdamW and quantrs.torch's step when torch happens to be installed), state bytes per
parameter, the step's effective bandwidth against the machine's read and triad bandwidth
(benches/_bandwidth.py), the step over GPT-2 small's 148 parameters (quantrs.torch against
torch's fused AdamW, alternating), and the convergence table of the v maps and m methods against the
float32 oracle.

Run: python benches/bench_optim.py [--quick] [--json] [--log2n 24] [--repeats 7] [--threads N]
     [--no-step] [--no-list] [--no-convergence] [--all-maps] [--baseline-build PATH]
(--threads sets RAYON_NUM_THREADS for quantrs; NumPy's element-wise ops are single-threaded.)
--quick: 2^22 elements, 3 repeats, convergence of the default nf4 state only. --json: print only
a JSON list of rows (benchmark convention, docs/cli.md). --baseline-build: another build's
extension (a saved copy of python/quantrs/_core.abi3.so) whose NumPy-API step is timed in turn
with this build's, in the same process: a before / after pair under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# NumPy's element-wise AdamW is single-threaded; an idle OpenBLAS pool would still spin on a
# core after BLAS-using setup calls and steal it from the kernel timed next (docs/benchmarks.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bandwidth import bandwidth  # noqa: E402
from _common import reexec_without_openblas_overrides  # noqa: E402

BASELINE = "numpy f32 AdamW (in-place ops)"


def numpy_adamw_step(w, g, m, v, tmp, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """Float32 AdamW with plain in-place NumPy ops (the baseline of docs/benchmarks.md)."""
    import numpy as np

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


def alternate(fns: dict, repeats: int, pause: float = 0.05, cpu: dict | None = None) -> dict:
    """``{name: (median, min)}`` in ms, the callables timed in turn, ``repeats`` rounds: on a
    machine shared with other jobs each round sees the same load for every implementation,
    so ratios of the medians (and of the mins) compare like with like. ``pause`` lets the
    OpenMP / OpenBLAS threads of the previous call go idle (a spinning torch pool slows the
    next kernel on the same cores, docs/optim.md). ``cpu``, when given, receives each call's
    process CPU time in ms (every thread's), per name and round: on a loaded machine the work
    a call did, where its wall time also holds the time its threads waited for a core."""
    times = {name: [] for name in fns}
    if cpu is not None:
        cpu.update({name: [] for name in fns})
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(pause)
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
            if cpu is not None:
                cpu[name].append((time.process_time() - c0) * 1e3)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def cpu_ratio(cpu: dict, base: str, ours: str) -> float:
    """The median over rounds of ``base``'s CPU time over ``ours``' (above 1: ours did less
    work), each round's pair timed back to back."""
    return statistics.median(b / o for b, o in zip(cpu[base], cpu[ours]))


def _torch():
    try:
        import torch  # only if already installed; never installed for this
    except ImportError:
        return None
    return torch


def load_build(path: str):
    """Another build's extension module (a saved ``_core`` shared object), imported under a
    name of its own so that it runs in this process next to the installed build (its own
    rayon pool, its own module state)."""
    import importlib.machinery
    import importlib.util

    name = "quantrs_baseline_build._core"
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def measure_step(log2n: int, repeats: int, baseline_build: str | None = None) -> dict:
    """Time one step of each implementation, alternating; returns the raw measurements."""
    import numpy as np

    import quantrs

    n = 1 << log2n
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n, dtype=np.float32)
    g = (rng.standard_normal(n, dtype=np.float32) * 0.01).astype(np.float32)
    fns, names = {}, {}  # name for rows -> callable, name for the table
    m, v, tmp = (np.zeros(n, np.float32) for _ in range(3))
    wn = w.copy()
    state = {"t": 0}

    def np_step():
        state["t"] += 1
        numpy_adamw_step(wn, g, m, v, tmp, state["t"])

    fns[BASELINE], names[BASELINE] = np_step, "NumPy float32 AdamW (in-place ops)"
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(quantrs.build_info()["threads"])  # the same thread count
        tw = torch.from_numpy(w.copy()).requires_grad_(True)
        tw.grad = torch.from_numpy(g.copy())
        topt = torch.optim.AdamW([tw], lr=1e-3, weight_decay=0.01, fused=True)
        nt = torch.get_num_threads()
        key = f"torch AdamW fused, {nt} threads"
        fns[key], names[key] = topt.step, f"torch AdamW(fused=True), {nt} threads"
    opt = quantrs.AdamW4bit(1e-3, 0.9, 0.999, 1e-8, 0.01)
    wq = w.copy()

    def q_step():
        opt.update(wq, g)
        opt.step()

    fns["defaults"], names["defaults"] = q_step, "quantrs AdamW4bit (defaults)"
    if baseline_build:
        old = load_build(baseline_build)
        oopt = old.AdamW4bit(1e-3, 0.9, 0.999, 1e-8, 0.01)
        wo = w.copy()

        def old_step():
            oopt.update(wo, g)
            oopt.step()

        fns["baseline build"] = old_step
        names["baseline build"] = f"quantrs AdamW4bit (defaults), baseline build {baseline_build}"
    if torch is not None:
        import quantrs.torch as qt

        pw = torch.from_numpy(w.copy()).requires_grad_(True)
        pw.grad = torch.from_numpy(g.copy())
        qopt = qt.AdamW4bit([pw], lr=1e-3, weight_decay=0.01)
        fns["quantrs.torch"], names["quantrs.torch"] = qopt.step, "quantrs.torch.AdamW4bit"
    for fn in fns.values():
        fn()  # state allocation
    bw = bandwidth(quantrs.build_info()["threads"])
    cpu: dict = {}
    times = alternate(fns, repeats, cpu=cpu)
    mu = opt.memory_usage()
    bpp = mu.total_bytes / mu.num_parameters
    baselines = [
        (names[k], k, times[k], bpp if k == "baseline build" else 8.0)
        for k in fns
        if k not in ("defaults", "quantrs.torch")
    ]
    ours = [(names[k], k, times[k], bpp) for k in fns if k in ("defaults", "quantrs.torch")]

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
        ours.append(
            (
                f"quantrs AdamW4bit method={method}",
                f"method={method}",
                ms,
                mu2.total_bytes / mu2.num_parameters,
            )
        )

    return {
        "bandwidth": bw,
        "cpu_vs_baseline_build": cpu_ratio(cpu, "baseline build", "defaults")
        if baseline_build
        else None,
        "log2n": log2n,
        "repeats": repeats,
        "info": quantrs.build_info(),
        "baselines": baselines,
        "ours": ours,
    }


def gpt2_small_shapes(width: int = 768, layers: int = 12, vocab: int = 50257, ctx: int = 1024):
    """The 148 parameter shapes of GPT-2 small (124.4 M parameters; weights as
    ``nn.Linear`` stores them): wte, wpe, per block ln_1 (weight, bias), attn c_attn
    (weight, bias), attn c_proj (weight, bias), ln_2, mlp c_fc, mlp c_proj, then ln_f."""
    w = width
    shapes = [(vocab, w), (ctx, w)]
    for _ in range(layers):
        shapes += [(w,), (w,), (3 * w, w), (3 * w,), (w, w), (w,)]
        shapes += [(w,), (w,), (4 * w, w), (4 * w,), (w, 4 * w), (w,)]
    return shapes + [(w,), (w,)]


def multi_step_fn(core, shapes, gen_seed: int = 1):
    """One ``core.adam4bit_multi_step`` over NumPy parameters of ``shapes`` (one engine per
    parameter, as the torch adapter keeps them): the list step of one build without torch."""
    import numpy as np

    rng = np.random.default_rng(gen_seed)
    ws = [(rng.standard_normal(s, dtype=np.float32) * 0.02) for s in shapes]
    gs = [(rng.standard_normal(s, dtype=np.float32) * 0.01) for s in shapes]
    engines = [core.AdamW4bit(1e-4, 0.9, 0.999, 1e-8, 0.01) for _ in shapes]
    return lambda: core.adam4bit_multi_step(engines, ws, gs)


def measure_list(
    repeats: int, quick: bool = False, baseline_build: str | None = None
) -> dict | None:
    """One step over the GPT-2-small parameter list: ``quantrs.torch.AdamW4bit`` (one Rust
    call for the group) against ``torch.optim.AdamW(fused=True)``, alternating, and with
    ``baseline_build`` the NumPy-API list step of both builds; None without torch."""
    torch = _torch()
    if torch is None:
        return None
    import quantrs
    import quantrs.torch as qt

    shapes = gpt2_small_shapes(256, 4, 8192, 128) if quick else gpt2_small_shapes()
    torch.set_num_threads(quantrs.build_info()["threads"])
    gen = torch.Generator().manual_seed(0)

    def params():
        ps = [(torch.randn(s, generator=gen) * 0.02).requires_grad_(True) for s in shapes]
        for p in ps:
            p.grad = torch.randn(p.shape, generator=gen) * 0.01
        return ps

    p_torch, p_ours = params(), params()
    topt = torch.optim.AdamW(p_torch, lr=1e-4, weight_decay=0.01, fused=True)
    qopt = qt.AdamW4bit(p_ours, lr=1e-4, weight_decay=0.01)
    fns = {"torch AdamW fused": topt.step, "quantrs.torch.AdamW4bit": qopt.step}
    if baseline_build:
        from quantrs import _core

        fns["NumPy API multi-step, this build"] = multi_step_fn(_core, shapes)
        fns["NumPy API multi-step, baseline build"] = multi_step_fn(
            load_build(baseline_build), shapes
        )
    for fn in fns.values():
        fn()
    bw = bandwidth(quantrs.build_info()["threads"])
    n = sum(p.numel() for p in p_ours)
    cpu: dict = {}
    times = alternate(fns, repeats, cpu=cpu)
    pair = ("NumPy API multi-step, baseline build", "NumPy API multi-step, this build")
    return {
        "times": times,
        "cpu_vs_baseline_build": cpu_ratio(cpu, *pair) if baseline_build else None,
        "tensors": len(shapes),
        "numel": n,
        "bandwidth": bw,
        "bytes_per_param": qopt.state_bytes() / n,
        "info": quantrs.build_info(),
        "repeats": repeats,
    }


def list_rows(meas: dict) -> list[dict]:
    """The list step's row in the benchmark convention."""
    (med, best), (bmed, bbest) = (
        meas["times"]["quantrs.torch.AdamW4bit"],
        meas["times"]["torch AdamW fused"],
    )
    n, bpp = meas["numel"], meas["bytes_per_param"]
    return [
        {
            "bench": f"AdamW4bit step, GPT-2-small list ({meas['tensors']} tensors, "
            f"{n / 1e6:.1f} M) quantrs.torch",
            "ours_ms": med,
            "baseline": "torch AdamW fused",
            "baseline_ms": bmed,
            "ratio": bmed / med,
            "ratio_min": bbest / best,
            "bytes_per_param": bpp,
            "baseline_bytes_per_param": 8.0,
            "threads": meas["info"]["threads"],
            "step_GBps": (12 + 2 * bpp) * n / (med * 1e-3) / 1e9,
            "read_GBps": meas["bandwidth"]["read_GBps"],
            "triad_GBps": meas["bandwidth"]["triad_GBps"],
        }
    ]


def print_list(meas: dict) -> None:
    n, bw = meas["numel"], meas["bandwidth"]
    print(
        f"\n## Optimizer step, GPT-2-small parameter list ({meas['tensors']} tensors, "
        f"{n / 1e6:.1f} M parameters; median of {meas['repeats']}, alternating; "
        f"load={os.getloadavg()[0]:.1f})\n"
    )
    print(f"Memory bandwidth: read {bw['read_GBps']:.1f} GB/s, triad {bw['triad_GBps']:.1f} GB/s\n")
    print("| implementation | median ms | min ms | bytes / param | step GB/s |")
    print("|---|---|---|---|---|")
    for name, (med, best) in meas["times"].items():
        bpp = 8.0 if name.startswith("torch") else meas["bytes_per_param"]
        gbps = (12 + 2 * bpp) * n / (med * 1e-3) / 1e9
        print(f"| {name} | {med:.1f} | {best:.1f} | {bpp:.3f} | {gbps:.1f} |")
    (med, best), (bmed, bbest) = (
        meas["times"]["quantrs.torch.AdamW4bit"],
        meas["times"]["torch AdamW fused"],
    )
    print(f"\nquantrs.torch vs torch fused: {bmed / med:.2f}x (median), {bbest / best:.2f}x (min)")
    pair = ("NumPy API multi-step, this build", "NumPy API multi-step, baseline build")
    if all(k in meas["times"] for k in pair):
        (med, best), (bmed, bbest) = (meas["times"][k] for k in pair)
        print(
            f"this build vs baseline build: {bmed / med:.2f}x (median), {bbest / best:.2f}x (min); "
            f"CPU time {meas['cpu_vs_baseline_build']:.3f}x (median of the per-round ratios)"
        )


def step_gbps(log2n: int, state_bytes_per_param: float, ms: float) -> float:
    """The step's effective bandwidth: the least traffic of an Adam step (the parameter read
    and written, the gradient read: 12 bytes, and the state read and written) over its
    time, in GB/s."""
    return (12 + 2 * state_bytes_per_param) * (1 << log2n) / (ms * 1e-3) / 1e9


def step_rows(meas: dict) -> list[dict]:
    """One row per (quantrs variant, baseline) pair, in the benchmark convention."""
    rows = []
    threads = meas["info"]["threads"]
    for _, method, (med, best), bpp in meas["ours"]:
        for _, bname, (bmed, bbest), bbpp in meas["baselines"]:
            rows.append(
                {
                    "bench": f"AdamW4bit step 2^{meas['log2n']} {method}",
                    "ours_ms": med,
                    "baseline": bname,
                    "baseline_ms": bmed,
                    "ratio": bmed / med,
                    "ratio_min": bbest / best,
                    "bytes_per_param": bpp,
                    "baseline_bytes_per_param": bbpp,
                    "threads": threads,
                    "step_GBps": step_gbps(meas["log2n"], bpp, med),
                    "triad_GBps": meas["bandwidth"]["triad_GBps"],
                    "read_GBps": meas["bandwidth"]["read_GBps"],
                }
            )
    return rows


def print_step(meas: dict) -> None:
    info, log2n, repeats = meas["info"], meas["log2n"], meas["repeats"]
    np_ms = meas["baselines"][0][2]
    print(
        f"\n## Optimizer step, one float32 parameter of 2^{log2n} elements "
        f"(median of {repeats}; simd={info['simd']}, threads={info['threads']}, "
        f"cpus={os.cpu_count()}, load={os.getloadavg()[0]:.1f})\n"
    )
    bw = meas["bandwidth"]
    print(
        f"Memory bandwidth ({bw['how']}): read {bw['read_GBps']:.1f} GB/s, "
        f"triad {bw['triad_GBps']:.1f} GB/s\n"
    )
    print(
        "| implementation | median ms | vs NumPy | min ms | vs NumPy (min) | bytes / param "
        "| step GB/s | of triad |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, _, (med, best), bpp in meas["baselines"] + meas["ours"]:
        gbps = step_gbps(log2n, bpp, med)
        print(
            f"| {name} | {med:.1f} | {np_ms[0] / med:.2f}x | {best:.1f} | {np_ms[1] / best:.2f}x "
            f"| {bpp:.3f} | {gbps:.1f} | {gbps / bw['triad_GBps']:.0%} |"
        )
    print()
    if meas["cpu_vs_baseline_build"] is not None:
        print(
            "this build vs baseline build, CPU time of the NumPy-API step (median of the "
            f"per-round ratios): {meas['cpu_vs_baseline_build']:.3f}x"
        )
    for name, key, (med, best), _ in meas["ours"]:
        if key not in ("defaults", "quantrs.torch"):
            continue
        for bname, _, (bmed, bbest), _ in meas["baselines"][1:]:
            print(f"{name} vs {bname}: {bmed / med:.2f}x (median), {bbest / best:.2f}x (min)")


def make(method: str, vmap: str | None, lr: float):
    import quantrs

    q = quantrs.AdvancedQuantizationConfig(method, variance_map=vmap)
    return quantrs.AdamW4bit.with_quantization_config(quantrs.Adam4bitOptimizerConfig(lr), q)


def tracking(curve, base):
    """Mean relative gap of the loss curve to float32's (lower is better)."""
    import numpy as np

    c, b = np.asarray(curve), np.asarray(base)
    return float(np.mean(c / b - 1))


def bench_convergence(methods, vmaps, verbose: bool = True) -> list[dict]:
    """Final loss of each method x v map against float32 AdamW on the reference tasks.

    Prints the table as it goes when ``verbose``; returns information rows (no times).
    """
    from convergence import quick as R

    if verbose:
        print("\n## Convergence vs float32 AdamW (final full loss, relative; cosine schedule)\n")
        print("Tracking = mean relative gap of the per-step training loss over the whole run.\n")
        print("| task | m method | v map | final loss | vs float32 | tracking |")
        print("|---|---|---|---|---|---|")
    rows = []
    for tname, T in R.CONVERGENCE_TASKS.items():
        steps, lr = R.CONVERGENCE_SETTINGS[tname]
        task = T()
        base_curve: list = []
        base = R.train(task, R.AdamWReference(lr), steps, lr, base_curve)
        if verbose:
            print(f"| {tname} | float32 | - | {base:.5f} | - | - |")
        for method in methods:
            for vmap in vmaps:
                curve: list = []
                loss = R.train(task, make(method, vmap, lr), steps, lr, curve)
                tr = tracking(curve, base_curve)
                rel, trk, vm = 100 * (loss / base - 1), 100 * tr, vmap or "default"
                rows.append(
                    {
                        "bench": f"convergence {tname} {method} vmap={vm}",
                        "ours_ms": None,
                        "baseline": "float32 AdamW (reference)",
                        "baseline_ms": None,
                        "ratio": None,
                        "final_loss": float(loss),
                        "float32_loss": float(base),
                        "vs_float32_pct": float(rel),
                        "tracking_pct": float(trk),
                    }
                )
                if verbose:
                    print(
                        f"| {tname} | {method} | {vm} | {loss:.5f} | {rel:+.2f} % | {trk:+.2f} % |",
                        flush=True,
                    )
    return rows


def convergence_suites(quick: bool, all_maps: bool) -> list[tuple[list, list]]:
    vmaps = ["linear", "sqrt_linear", "log", "sqrt_log"]
    if quick:
        return [(["nf4"], [None])]
    if all_maps:
        return [(["nf4", "int4", "dynamic", "int8"], vmaps)]
    return [(["nf4"], vmaps), (["int4", "dynamic", "int8"], [None])]


def run(
    quick: bool = False,
    log2n: int | None = None,
    repeats: int | None = None,
    step: bool = True,
    convergence: bool = True,
    step_list: bool = True,
    all_maps: bool = False,
    verbose: bool = False,
    baseline_build: str | None = None,
) -> list[dict]:
    """Rows in the benchmark convention (docs/cli.md); prints the tables when ``verbose``."""
    log2n = log2n if log2n is not None else (22 if quick else 24)
    repeats = repeats if repeats is not None else (3 if quick else 7)
    rows: list[dict] = []
    if step:
        meas = measure_step(log2n, repeats, baseline_build)
        if verbose:
            print_step(meas)
        rows += step_rows(meas)
    if step_list:
        lm = measure_list(repeats, quick, baseline_build)
        if lm is not None:
            if verbose:
                print_list(lm)
            rows += list_rows(lm)
    if convergence:
        for methods, vmaps in convergence_suites(quick, all_maps):
            rows += bench_convergence(methods, vmaps, verbose=verbose)
    return rows


def main():
    reexec_without_openblas_overrides()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="2^22 elements, 3 repeats, tiny convergence"
    )
    ap.add_argument("--json", action="store_true", help="print only a JSON list of rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    ap.add_argument("--log2n", type=int, default=None, help="default 24 (--quick: 22)")
    ap.add_argument("--repeats", type=int, default=None, help="default 7 (--quick: 3)")
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--no-convergence", action="store_true")
    ap.add_argument(
        "--no-list", action="store_true", help="skip the GPT-2-small list step (needs torch)"
    )
    ap.add_argument("--all-maps", action="store_true", help="every method x every v map")
    ap.add_argument("--threads", type=int, default=None, help="rayon threads for quantrs")
    ap.add_argument(
        "--baseline-build",
        default=None,
        metavar="PATH",
        help="another build's _core shared object, its step timed in turn with this one's",
    )
    a = ap.parse_args()
    if a.threads:
        os.environ["RAYON_NUM_THREADS"] = str(a.threads)  # before quantrs is imported
    rows = run(
        a.quick,
        log2n=a.log2n,
        repeats=a.repeats,
        step=not a.no_step,
        convergence=not a.no_convergence,
        step_list=not a.no_list,
        all_maps=a.all_maps,
        verbose=not a.json,
        baseline_build=a.baseline_build,
    )
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
