"""FP8 benchmarks: codecs against ml_dtypes, PerTensorFP8Linear.forward against NumPy.

    python benches/bench_fp8.py [--quick] [--json] [--repeats 7] [--warm]
                                [--only codecs|forward|smol]

- encode / decode of 2^24 values: quantrs.fp8 vs ml_dtypes casts (fresh output
  arrays on both sides); medians of ``--repeats`` calls.
- forward of a 4096x4096 layer at batch 1, 16, 128, and of 11008x4096 and
  4096x11008 (out x in) at batch 1: NumPy float32 ``x @ W.T`` (``W @ x`` at
  batch 1, NumPy's GEMV) vs
  ``PerTensorFP8Linear.forward`` weight-only (W8A32) and with a static
  activation scale (W8A8). NumPy and quantrs alternate (``_common.paired_ms``:
  a warm-up instead of a sleep between them, the ratio is the median of the
  per-pair ratios, so a machine whose speed drifts compares both under the same
  conditions). By default the weights are streamed from DRAM, as for a model
  larger than the caches: each side's calls rotate over enough copies of its
  weights (>= 96 MiB in all, three times the L3) that none is still cached when
  reused; ``--warm`` times a single copy, which stays in cache.
- ``--only smol``: batch 1 on SmolLM2-135M's linear shapes (one copy, in cache,
  as in a small model's decode step) against NumPy's GEMV, and the per-call
  cost of ``forward`` on a 32x32 layer (the kernel under a microsecond: what
  the call costs around it), wall clock and process CPU time.

Every run that times the forward ends with the machine's 2-thread read
bandwidth (``_bandwidth.Bandwidth``), probed next to the timings.

Ratios are NumPy (or ml_dtypes) time / quantrs time: > 1 means quantrs is faster.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (  # noqa: E402
    emit,
    machine_note,
    median_ms,
    paired_ms,
    reexec_without_openblas_overrides,
    settle,
)

_STREAM_BYTES = 96 << 20  # working set per side for "weights streamed from DRAM"


def _row(bench: str, base_ms: float, ours_ms: float, baseline: str, **extra) -> dict:
    return {
        "bench": bench,
        "ours_ms": ours_ms,
        "baseline": baseline,
        "baseline_ms": base_ms,
        "ratio": base_ms / ours_ms,
        **extra,
    }


def codecs(rng, repeats: int) -> list[dict]:
    import ml_dtypes
    import numpy as np

    from quantrs import fp8

    n = 1 << 24
    x = (rng.standard_normal(n) * 50).astype(np.float32)
    rows = []
    for fmt, dt in [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]:
        base = median_ms(lambda dt=dt: x.astype(dt), repeats)
        ours = median_ms(lambda fmt=fmt: fp8.encode(x, fmt), repeats)
        rows.append(_row(f"fp8 encode 2^24 f32 -> {fmt}", base, ours, "ml_dtypes astype"))
        codes = fp8.encode(x, fmt)
        f8 = codes.view(dt)
        base = median_ms(lambda f8=f8: f8.astype(np.float32), repeats)
        ours = median_ms(lambda codes=codes, fmt=fmt: fp8.decode(codes, fmt), repeats)
        rows.append(_row(f"fp8 decode 2^24 {fmt} -> f32", base, ours, "ml_dtypes astype"))
    base = median_ms(lambda: x.astype(ml_dtypes.float8_e4m3fn), repeats)
    ours = median_ms(lambda: fp8.encode(x, "e4m3", saturate=True), repeats)
    rows.append(_row("fp8 encode 2^24 e4m3 saturating", base, ours, "ml_dtypes astype"))
    return rows


def forward(rng, repeats: int, warm: bool, quick: bool) -> list[dict]:
    import numpy as np

    act_scale = float(np.float32(4.0 / 448))
    where = "cache" if warm else "DRAM"
    rows = []
    # (out, in): the square layer at every batch; the two MLP shapes of a
    # 4096-wide model at batch 1, where the fused decode-dot streams codes.
    shapes = [((4096, 4096), [1, 128] if quick else [1, 16, 128])]
    if not quick:
        shapes += [((11008, 4096), [1]), ((4096, 11008), [1])]
    for (m, k), batches in shapes:
        rows += _forward_shape(np, rng, m, k, batches, act_scale, warm, where, repeats)
    return rows


def _forward_shape(np, rng, m, k, batches, act_scale, warm, where, repeats) -> list[dict]:
    from quantrs import PerTensorFP8Linear

    w = (rng.standard_normal((m, k)) / 64).astype(np.float32)
    # Copies of the weights for each side: one (in cache) with --warm, else
    # enough that the rotation's working set is >= 96 MiB (3x the L3).
    n_base = 1 if warm else max(2, -(-_STREAM_BYTES // w.nbytes))
    n_ours = 1 if warm else max(6, -(-_STREAM_BYTES // (m * k)))
    base_ws = [w] + [w * (i + 1) for i in range(1, n_base)]
    layers = {
        "W8A32": [PerTensorFP8Linear.from_float(w * (i + 1)) for i in range(n_ours)],
        "W8A8": [
            PerTensorFP8Linear.from_float(w * (i + 1), activation_scale=act_scale)
            for i in range(n_ours)
        ],
    }
    rows = []
    for batch in batches:
        xb = rng.standard_normal((batch, k)).astype(np.float32)
        if batch == 1:
            xb = xb[0]
        pairs, inner = (max(3, repeats // 2), 2) if batch == 128 else (repeats, 5)
        for kind, copies in layers.items():
            base_cyc = itertools.cycle(base_ws)
            ours_cyc = itertools.cycle(copies)
            # Batch 1: NumPy's 1-D GEMV (W @ x), its fastest path for it.
            base_fn = (
                (lambda xb=xb, cyc=base_cyc: next(cyc) @ xb)
                if batch == 1
                else (lambda xb=xb, cyc=base_cyc: xb @ next(cyc).T)
            )
            base, ours, ratio = paired_ms(
                base_fn,
                lambda xb=xb, cyc=ours_cyc: next(cyc).forward(xb),
                pairs,
                inner,
            )
            flops = 2.0 * batch * m * k
            rows.append(
                {
                    "bench": f"fp8 forward {m}x{k} (out x in) b{batch} {kind} ({where})",
                    "ours_ms": ours,
                    "baseline": "numpy f32 W@x" if batch == 1 else "numpy f32 x@W.T",
                    "baseline_ms": base,
                    "ratio": ratio,
                    "weights": where,
                    "copies": f"{n_base}/{n_ours}",
                    "weight_GB/s": m * k / (ours * 1e-3) / 1e9,
                    "ours_GFLOP/s": flops / (ours * 1e-3) / 1e9,
                    "numpy_GFLOP/s": flops / (base * 1e-3) / 1e9,
                }
            )
            settle()
    return rows


def smol(rng, repeats: int) -> list[dict]:
    """Batch 1 on SmolLM2-135M's shapes, in cache, and the per-call cost."""
    import numpy as np

    from quantrs import PerTensorFP8Linear

    act_scale = float(np.float32(4.0 / 448))
    rows = []
    for m, k in [(576, 576), (192, 576), (1536, 576), (576, 1536)]:
        w = (rng.standard_normal((m, k)) / 64).astype(np.float32)
        x = rng.standard_normal(k).astype(np.float32)
        for kind, a in [("W8A32", None), ("W8A8", act_scale)]:
            layer = PerTensorFP8Linear.from_float(w, activation_scale=a)
            base, ours, ratio = paired_ms(
                lambda w=w, x=x: w @ x, lambda f=layer.forward, x=x: f(x), repeats, 200
            )
            rows.append(
                {
                    "bench": f"fp8 forward {m}x{k} (out x in) b1 {kind} (cache)",
                    "ours_ms": ours,
                    "baseline": "numpy f32 W@x",
                    "baseline_ms": base,
                    "ratio": ratio,
                    "weight_GB/s": m * k / (ours * 1e-3) / 1e9,
                }
            )
            settle()
    rows += _call_cost(np, rng, repeats)
    return rows


def _call_cost(np, rng, repeats: int) -> list[dict]:
    """``forward`` on a 32x32 layer at batch 1: wall and process CPU per call."""
    import time

    from quantrs import PerTensorFP8Linear

    w = rng.standard_normal((32, 32)).astype(np.float32)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    rows = []
    for kind, a in [("W8A32", None), ("W8A8", 0.01)]:
        f = PerTensorFP8Linear.from_float(w, activation_scale=a).forward
        walls, cpus, n = [], [], 20000
        for _ in range(repeats):
            t, c = time.perf_counter_ns(), time.process_time_ns()
            for _ in range(n):
                f(x)
            walls.append((time.perf_counter_ns() - t) / n / 1e3)
            cpus.append((time.process_time_ns() - c) / n / 1e3)
        rows.append(
            {
                "bench": f"fp8 forward call 32x32 b1 {kind}",
                "ours_ms": float(np.median(walls)) / 1e3,
                "baseline": "process CPU us per call",
                "baseline_ms": float(np.median(cpus)) / 1e3,
                "ratio": float("nan"),
            }
        )
    return rows


def run(
    quick: bool = False,
    repeats: int | None = None,
    warm: bool = False,
    only: str | None = None,
) -> list[dict]:
    import numpy as np

    if repeats is None:
        repeats = 3 if quick else 7
    rng = np.random.default_rng(0)
    rows = []
    if only in (None, "codecs"):
        rows += codecs(rng, repeats)
    if only in (None, "forward"):
        rows += forward(rng, repeats, warm, quick)
    if only == "smol":
        rows += smol(rng, repeats)
    if only != "codecs":
        from _bandwidth import Bandwidth

        bw = Bandwidth(np, threads=2)
        bw.read()
        rows.append({"bench": f"read bandwidth ({bw.kind})", **bw.summary()})
    return rows


COLUMNS = [
    "bench",
    "ours_ms",
    "baseline_ms",
    "ratio",
    "baseline",
    "copies",
    "weight_GB/s",
    "ours_GFLOP/s",
    "numpy_GFLOP/s",
    "read_GB/s",
]


def main() -> None:
    reexec_without_openblas_overrides()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    ap.add_argument(
        "--repeats", type=int, help="codec repeats / forward pairs (default 7, --quick 3)"
    )
    ap.add_argument("--warm", action="store_true", help="one copy of the weights (in cache)")
    ap.add_argument(
        "--only", choices=["codecs", "forward", "smol"], help="run one part (smol: not by default)"
    )
    args = ap.parse_args()
    import ml_dtypes
    import numpy as np

    import quantrs

    if not args.json:
        print(
            f"quantrs {quantrs.build_info()}; numpy {np.__version__}, "
            f"ml_dtypes {ml_dtypes.__version__}; {machine_note()}"
        )
    emit(run(args.quick, args.repeats, args.warm, args.only), COLUMNS, args.json)


if __name__ == "__main__":
    main()
