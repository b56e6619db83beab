"""Prefill-sized batches (M = 64-512 rows) through the INT4 and FP8 paths
against PyTorch's ``torch.nn.functional.linear`` in float32 and bfloat16.

Per layer shape (in -> out) and batch M: quantrs INT4 ``matmul`` (g32 and
g128, float32 and ``activations="int8"``), FP8 ``PerTensorFP8Linear``
W8A32 / W8A8 ``forward``, and torch's ``F.linear`` on the float32 weight
and on a bfloat16 copy (bfloat16 input and weight: oneDNN's AMX path on
CPUs that have it), and quantrs INT4 on the bfloat16 input (``int4 g32 bf16``: the
bf16 tile GEMM, bfloat16 out). The shapes are SmolLM2-135M's linears (576 -> 576,
576 -> 192, 576 -> 1536, 1536 -> 576, 576 -> 49152) and a 4096-wide
model's (4096 -> 4096, 4096 -> 11008). Each measurement is the median of
``inner`` calls; the whole set of variants runs ``rounds`` times in
alternation (torch first, then ours, in an order that rotates each round) and the
medians are reported, so a machine whose speed drifts compares all of them under the
same conditions.
``ratio`` is torch float32's time over ours (> 1: quantrs faster),
``vs_bf16`` the same against bfloat16. Both libraries run on 2 threads.

The last row is the machine's 2-thread read bandwidth (benches/_bandwidth.py).

    python benches/bench_prefill.py [--quick] [--json] [--batches 64,128,512] [--shapes smol]
        [--no-bf16] [--best] [--threads 1 --cpu-time] [--baseline-build PATH]

``--shapes smol`` runs SmolLM2's four block shapes only (576 -> 576, 576 -> 192, 576 -> 1536,
1536 -> 576): the quick rerun of the prefill table. On a host that other jobs load, wall
times of 2-thread calls measure the scheduler; the kernels' own speed is then
``RAYON_NUM_THREADS=1 python benches/bench_prefill.py --threads 1 --cpu-time``: one thread
each, the process's CPU time per call (time spent preempted does not count). ``--no-bf16``
leaves out the bfloat16 rows (on a CPU without bfloat16 instructions, Zen 3, they take most of
the run). ``--best`` times each set of calls by its fastest call instead of the median: on a
loaded host the 2-thread calls that no descheduled thread held up. ``--baseline-build PATH``
loads a second build of the extension (another checkout's ``python/quantrs/_core.abi3.so``)
into the same process and times its INT4 and FP8 variants too (``base int4 g32``,
...), alternated with ours in every round: a before / after comparison under the same load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bandwidth import Bandwidth
from _common import (
    call_seconds,
    emit,
    machine_note,
    median_ms,
    reexec_without_openblas_overrides,
)

THREADS = 2
SMOL = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]
WIDE = [(4096, 4096), (4096, 11008)]


def variants(np, quantrs, w):
    """Our callables for the float32 weight ``w`` ``[in, out]``: name ->
    (x, out) -> result."""
    act_scale = float(np.float32(4.0 / 448))
    wt = np.ascontiguousarray(w.T)
    q32 = quantrs.QuantizedWeight.quantize(w, group_size=32)
    q128 = quantrs.QuantizedWeight.quantize(w, group_size=128)
    f8 = quantrs.PerTensorFP8Linear.from_float(wt)
    f8a = quantrs.PerTensorFP8Linear.from_float(wt, activation_scale=act_scale)
    # A fresh result each call, as F.linear returns one (``out=`` costs more per call from
    # Python than the allocation it saves).
    return {
        "int4 g32": lambda x, o: q32.matmul(x),
        "int4 g32 a8": lambda x, o: q32.matmul(x, activations="int8"),
        "int4 g128": lambda x, o: q128.matmul(x),
        "int4 g128 a8": lambda x, o: q128.matmul(x, activations="int8"),
        "fp8 W8A32": lambda x, o: f8.forward(x),
        "fp8 W8A8": lambda x, o: f8a.forward(x),
    }


def bf16_variants(np, quantrs, w):
    """Ours on a bfloat16 input (its bits, a uint16 array) with a bfloat16 result: the
    torch layers' forward for a bf16 model (``_core.int4_linear_bf16``)."""
    k, n = w.shape
    out = {}
    for gs in (32, 128):
        q = quantrs.QuantizedWeight.quantize(w, group_size=gs)
        args = (np.asarray(q.data), np.asarray(q.scales), None, k, n, q.num_groups)
        out[f"int4 g{gs} bf16"] = lambda xb, args=args: quantrs._core.int4_linear_bf16(xb, *args)
    return out


def load_build(path: str):
    """Another build of ``quantrs._core`` (the ``.so`` at ``path``) as a module of its own
    name, next to the installed one (the classes ``variants`` uses live in ``_core``)."""
    import importlib.util
    import sys
    import types

    sys.modules.setdefault("quantrs_baseline", types.ModuleType("quantrs_baseline"))
    spec = importlib.util.spec_from_file_location("quantrs_baseline._core", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline-build: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_ms(fn, repeat: int, warmup: int = 1) -> float:
    """CPU time of the whole process per call of ``fn``, the median of ``repeat`` calls (all
    threads count, including a thread pool's spinning: meaningful on one thread each)."""
    return 1e3 * statistics.median(call_seconds(fn, repeat, warmup, time.process_time))


def best_ms(fn, repeat: int, warmup: int = 1) -> float:
    """Wall time of the fastest of ``repeat`` calls of ``fn``: on a host that other jobs
    load, the calls that no descheduled thread held up (both libraries' 2-thread calls wait
    for their slowest thread)."""
    return 1e3 * min(call_seconds(fn, repeat, warmup))


def shape_rows(
    np, torch, quantrs, rng, k, n, batches, rounds, timer=median_ms, bf16_rows=True, baseline=None
) -> list[dict]:
    import torch.nn.functional as F

    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    ours = variants(np, quantrs, w)
    if baseline is not None:
        ours |= {f"base {name}": fn for name, fn in variants(np, baseline, w).items()}
    ours16 = bf16_variants(np, quantrs, w) if bf16_rows else {}
    tw = torch.from_numpy(np.ascontiguousarray(w.T))
    tw16 = tw.to(torch.bfloat16)
    rows = []
    for m in batches:
        x = rng.standard_normal((m, k)).astype(np.float32)
        out = np.empty((m, n), dtype=np.float32)
        tx = torch.from_numpy(x)
        tx16 = tx.to(torch.bfloat16)
        xb = tx16.view(torch.uint16).numpy()
        inner = max(2, min(7, int(2e9 / (2.0 * m * k * n))))
        with torch.inference_mode():
            base = {"torch f32": lambda tx=tx: F.linear(tx, tw)}
            if bf16_rows:
                base["torch bf16"] = lambda tx16=tx16: F.linear(tx16, tw16)
            times: dict[str, list[float]] = {name: [] for name in [*base, *ours, *ours16]}
            names = list(ours)
            for r in range(rounds):
                for name, fn in base.items():
                    times[name].append(timer(fn, inner))
                # Ours in an order that rotates each round: the variant timed right after
                # torch pays for torch's OpenMP threads still spinning, so no one variant
                # may always be that one.
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    fn = ours[name]
                    times[name].append(timer(lambda fn=fn, x=x, out=out: fn(x, out), inner))
                for name, fn in ours16.items():
                    times[name].append(timer(lambda fn=fn, xb=xb: fn(xb), inner))
        med = {name: statistics.median(t) for name, t in times.items()}
        f32, bf16 = med["torch f32"], med.get("torch bf16")
        gflop = 2.0 * m * k * n / 1e9
        for name, t in med.items():
            rows.append(
                {
                    "bench": f"{name} {k}->{n} M{m}",
                    "ours_ms": t,
                    "baseline": "torch f32 F.linear",
                    "baseline_ms": f32,
                    "ratio": f32 / t,
                    "vs_bf16": bf16 / t if bf16 else None,
                    "GFLOP/s": gflop / (t * 1e-3),
                }
            )
    return rows


def run(
    quick: bool = False,
    batches: list[int] | None = None,
    rounds: int = 3,
    shapes: str = "all",
    threads: int = THREADS,
    cpu_time: bool = False,
    bf16_rows: bool = True,
    best: bool = False,
    baseline_build: str | None = None,
) -> list[dict]:
    import numpy as np
    import torch

    import quantrs

    torch.set_num_threads(threads)
    timer = cpu_ms if cpu_time else best_ms if best else median_ms
    rng = np.random.default_rng(0)
    batches = batches or ([128] if quick else [64, 128, 512])
    if shapes == "smol":
        chosen = SMOL[:4]
    else:
        chosen = SMOL[:4] + WIDE[:1] if quick else SMOL + WIDE
    baseline = load_build(baseline_build) if baseline_build else None
    rows = []
    for k, n in chosen:
        rows += shape_rows(
            np, torch, quantrs, rng, k, n, batches, rounds, timer, bf16_rows, baseline
        )
    probe = Bandwidth(np, (1 << 28) if quick else (1 << 30), threads=THREADS)
    read = probe.read()
    rows.append({"bench": f"machine read ({probe.kind}) {read:.1f} GB/s", "ours_ms": None})
    return rows


COLUMNS = ["bench", "ours_ms", "baseline_ms", "ratio", "vs_bf16", "GFLOP/s"]


def main() -> None:
    reexec_without_openblas_overrides()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes, batch 128 only")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    ap.add_argument("--batches", help="comma-separated batch sizes (default 64,128,512)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument(
        "--shapes",
        choices=["all", "smol"],
        default="all",
        help="smol: SmolLM2's four block shapes only",
    )
    ap.add_argument("--threads", type=int, default=THREADS, help="torch threads (default 2)")
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall time")
    ap.add_argument(
        "--no-bf16",
        action="store_true",
        help="leave out the bfloat16 rows (CPUs without bfloat16 instructions run them slowly)",
    )
    ap.add_argument("--best", action="store_true", help="fastest call of each set, not median")
    ap.add_argument(
        "--baseline-build",
        metavar="PATH",
        help="another build's _core .so, timed alongside ours (variants named 'base ...')",
    )
    args = ap.parse_args()
    import quantrs

    if not args.json:
        print(f"quantrs {quantrs.build_info()}; {machine_note()}")
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    rows = run(
        args.quick,
        batches,
        args.rounds,
        args.shapes,
        args.threads,
        args.cpu_time,
        not args.no_bf16,
        args.best,
        args.baseline_build,
    )
    emit(rows, COLUMNS, args.json)


if __name__ == "__main__":
    main()
