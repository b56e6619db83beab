"""INT4 `QuantizedWeight` benchmarks against NumPy float32 ``x @ W``.

Prints, per shape / group size / batch: our time, NumPy's time, the ratio
(the median of per-pair ratios over alternating NumPy / quantrs runs, so a
machine whose speed drifts compares both under the same conditions),
the GB/s of packed weight (+ scales) read, and for batch 1 the fraction of
the machine's streaming read bandwidth; for large batches the GFLOP/s of both.

Then the ``activations="int8"`` rows (``A8``: x quantized per group to int8,
integer dot products, docs/int4.md) for g32 on 4096x4096, 4096x11008 and
11008x4096 at batch 1, 4, 16 and 128, each paired with NumPy the same way
(``--no-a8`` skips them, ``--a8-only`` runs only them).

When bitsandbytes and PyTorch are installed (not requirements), rows of its
NF4 ``Linear4bit`` at batch 16 and 128 on 4096x4096 follow, against NumPy too.

The read bandwidth is ``benches/_bandwidth.py``'s read probe (one slice per
core of a buffer far larger than the caches, 1 GiB; 256 MiB with --quick,
reduced by NumPy on a thread pool), the same probe bench_decode.py uses. It
is measured right after our timing in
every pair, and ``of_read_bw`` is the median of the per-pair fractions: on a
shared or virtual machine the rate drifts within a minute, and a single probe
at the start of the run would compare our kernel with whatever the neighbours
were doing then. The last row gives the median of all probes of the run.

``--matvec`` runs only batch 1, float32 and int8 activations, g32 and g128, on
4096x11008, 11008x4096 and (without ``--quick``) SmolLM2-135M's linears
(576x1536, 1536x576, 576x576), then ``PerTensorFP8Linear.forward`` W8A32 and
W8A8 on the two large layers: every batch-1 kernel with its fraction of the
read probe, in one table.

    python benches/bench_int4.py [--quick] [--json] [--no-a8 | --a8-only | --matvec]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bandwidth import Bandwidth  # noqa: E402
from _common import (  # noqa: E402
    emit,
    machine_note,
    paired_ms,
    reexec_without_openblas_overrides,
    settle,
)


def dram_copies(quantrs, qw) -> list:
    """`qw` and enough copies of it (>= 96 MiB in all) that a call rotating
    over them finds none still cached: batch 1 then streams its weights from
    DRAM, as a layer of a model larger than the caches does."""
    return [qw] + [
        quantrs.QuantizedWeight.from_bytes(qw.to_bytes())
        for _ in range(-(-(96 << 20) // qw.nbytes) - 1)
    ]


def matvec_paired(probe, w, copies, x, out, act: str, pairs: int, inner: int):
    """Batch 1 from DRAM (`copies` rotated) against NumPy's ``x @ w``, with
    our packed-weight read rate over the read probe taken right after our
    timing in each pair: (NumPy ms, our ms, ratio, median fraction)."""
    cycle = itertools.cycle(copies)
    nbytes = copies[0].nbytes
    fracs: list[float] = []
    base, ours, ratio = paired_ms(
        lambda: x @ w,
        lambda: next(cycle).matvec(x, out=out, activations=act),
        pairs,
        inner,
        after_ours=lambda o: fracs.append(nbytes / (o * 1e-3) / 1e9 / probe.read()),
    )
    return base, ours, ratio, statistics.median(fracs)


#: SmolLM2-135M's linears (576 hidden, 1536 MLP): the decode step of the
#: model that benches/bench_decode.py and the quality benches use.
SMOL_SHAPES = [(576, 1536), (1536, 576), (576, 576)]


def matvec_rows(np, quantrs, rng, probe, shapes, quick: bool) -> list[dict]:
    """Batch-1 ``matvec`` with float32 and int8 activations, g32 and g128,
    each as a fraction of the read probe (the batch-1 kernels at the
    memory limit, issue 31)."""
    rows = []
    pairs, inner = (3, 5) if quick else (7, 9)
    for k, n in shapes:
        w = rng.standard_normal((k, n), dtype=np.float32)
        x = rng.standard_normal(k, dtype=np.float32)
        out = np.empty(n, dtype=np.float32)
        for gs in (32, 128):
            qw = quantrs.QuantizedWeight.quantize(w, group_size=gs)
            copies = dram_copies(quantrs, qw)
            for act in ("float32", "int8"):
                base, ours, ratio, of_bw = matvec_paired(
                    probe, w, copies, x, out, act, pairs, inner
                )
                tag = "" if act == "float32" else "A8 "
                rows.append(
                    {
                        "bench": f"int4 {tag}matvec {k}x{n} g{gs} b1",
                        "ours_ms": ours,
                        "baseline": "numpy f32 x@W",
                        "baseline_ms": base,
                        "ratio": ratio,
                        "weight_GB/s": qw.nbytes / (ours * 1e-3) / 1e9,
                        "of_read_bw": of_bw,
                    }
                )
                settle()
    return rows


def fp8_matvec_rows(np, quantrs, rng, probe, shapes, quick: bool) -> list[dict]:
    """``PerTensorFP8Linear.forward`` at batch 1 (W8A32 and W8A8) on the same layers as
    `matvec_rows` (``k x n`` = in x out; the FP8 weight is stored ``[n, k]``), from DRAM,
    against NumPy's GEMV and as a fraction of the read probe: every batch-1 kernel in one
    table (issue 31)."""
    rows = []
    pairs, inner = (3, 5) if quick else (7, 9)
    for k, n in shapes:
        w = (rng.standard_normal((n, k)) / 64).astype(np.float32)
        x = rng.standard_normal(k).astype(np.float32)
        scale = float(np.abs(x).max()) / 448.0
        copies = -(-(96 << 20) // (n * k))
        for kind, a_scale in (("W8A32", None), ("W8A8", scale)):
            layers = [
                quantrs.PerTensorFP8Linear.from_float(w * (i + 1), activation_scale=a_scale)
                for i in range(copies)
            ]
            base, ours, ratio, of_bw = forward_paired(probe, w, layers, x, pairs, inner)
            rows.append(
                {
                    "bench": f"fp8 {kind} forward {k}x{n} b1",
                    "ours_ms": ours,
                    "baseline": "numpy f32 W@x",
                    "baseline_ms": base,
                    "ratio": ratio,
                    "weight_GB/s": n * k / (ours * 1e-3) / 1e9,
                    "of_read_bw": of_bw,
                }
            )
            settle()
    return rows


def forward_paired(probe, w, layers, x, pairs: int, inner: int):
    """`matvec_paired` for FP8 layers: NumPy's ``w @ x`` against ``forward(x)`` rotating
    over `layers`, and our code-read rate over the read probe taken right after each of our
    timings: (NumPy ms, our ms, ratio, median fraction)."""
    cycle = itertools.cycle(layers)
    nbytes = w.size
    fracs: list[float] = []
    base, ours, ratio = paired_ms(
        lambda: w @ x,
        lambda: next(cycle).forward(x),
        pairs,
        inner,
        after_ours=lambda o: fracs.append(nbytes / (o * 1e-3) / 1e9 / probe.read()),
    )
    return base, ours, ratio, statistics.median(fracs)


def a8_rows(np, quantrs, rng, quick: bool) -> list[dict]:
    """``activations="int8"`` against NumPy float32, g32."""
    shapes = [(4096, 11008)] if quick else [(4096, 4096), (4096, 11008), (11008, 4096)]
    batches = [1, 4, 16, 32, 128]
    rows = []
    for k, n in shapes:
        w = rng.standard_normal((k, n), dtype=np.float32)
        qw = quantrs.QuantizedWeight.quantize(w, group_size=32)
        copies = dram_copies(quantrs, qw)
        for b in batches:
            x = rng.standard_normal((b, k), dtype=np.float32)
            out = np.empty((b, n), dtype=np.float32)
            pairs, inner = (3, 2) if b == 128 else (7, 5)
            if quick:
                pairs = max(3, pairs // 2)
            if b == 1:
                xv, ov, cycle = x[0], out[0], itertools.cycle(copies)
                base, ours, ratio = paired_ms(
                    lambda xv=xv, w=w: xv @ w,
                    lambda xv=xv, ov=ov, cyc=cycle: next(cyc).matvec(
                        xv, out=ov, activations="int8"
                    ),
                    pairs,
                    inner,
                )
            else:
                base, ours, ratio = paired_ms(
                    lambda x=x, w=w: x @ w,
                    lambda x=x, out=out, qw=qw: qw.matmul(x, out=out, activations="int8"),
                    pairs,
                    inner,
                )
            flops = 2.0 * b * k * n
            rows.append(
                {
                    "bench": f"int4 A8 {'matvec' if b == 1 else 'matmul'} {k}x{n} g32 b{b}",
                    "ours_ms": ours,
                    "baseline": "numpy f32 x@W",
                    "baseline_ms": base,
                    "ratio": ratio,
                    "weight_GB/s": qw.nbytes / (ours * 1e-3) / 1e9,
                    "ours_GFLOP/s": flops / (ours * 1e-3) / 1e9,
                    "numpy_GFLOP/s": flops / (base * 1e-3) / 1e9,
                }
            )
            settle()
    return rows


def run(quick: bool = False, a8: str = "with") -> list[dict]:
    import numpy as np

    import quantrs

    rng = np.random.default_rng(0)
    if a8 == "only":
        return a8_rows(np, quantrs, rng, quick)
    probe = Bandwidth(np, (1 << 28) if quick else (1 << 30))
    if a8 == "matvec":
        large = [(4096, 11008), (11008, 4096)]
        return (
            matvec_rows(np, quantrs, rng, probe, large + ([] if quick else SMOL_SHAPES), quick)
            + fp8_matvec_rows(np, quantrs, rng, probe, large, quick)
            + [probe_row(probe)]
        )
    shapes = [(4096, 11008)] if quick else [(4096, 4096), (4096, 11008)]
    groups = [32] if quick else [32, 128]
    batches = [1, 128] if quick else [1, 16, 128]
    rows = []
    for k, n in shapes:
        w = rng.standard_normal((k, n), dtype=np.float32)
        for gs in groups:
            qw = quantrs.QuantizedWeight.quantize(w, group_size=gs)
            copies = dram_copies(quantrs, qw)
            for b in batches:
                x = rng.standard_normal((b, k), dtype=np.float32)
                out = np.empty((b, n), dtype=np.float32)
                pairs, inner = (3, 2) if b == 128 else (7, 5)
                if quick:
                    pairs = max(3, pairs // 2)
                of_bw = None
                if b == 1:
                    xv, ov, cycle = x[0], out[0], itertools.cycle(copies)
                    # Our rate over the read rate measured right after it.
                    fracs: list[float] = []
                    base, ours, ratio = paired_ms(
                        lambda xv=xv, w=w: xv @ w,
                        lambda xv=xv, ov=ov, cyc=cycle: next(cyc).matvec(xv, out=ov),
                        pairs,
                        inner,
                        after_ours=lambda o, f=fracs, nb=qw.nbytes: f.append(
                            nb / (o * 1e-3) / 1e9 / probe.read()
                        ),
                    )
                    of_bw = statistics.median(fracs)
                else:
                    base, ours, ratio = paired_ms(
                        lambda x=x, w=w: x @ w,
                        lambda x=x, out=out, qw=qw: qw.matmul(x, out=out),
                        pairs,
                        inner,
                    )
                gbs = qw.nbytes / (ours * 1e-3) / 1e9
                flops = 2.0 * b * k * n
                row = {
                    "bench": f"int4 {'matvec' if b == 1 else 'matmul'} {k}x{n} g{gs} b{b}",
                    "ours_ms": ours,
                    "baseline": "numpy f32 x@W",
                    "baseline_ms": base,
                    "ratio": ratio,
                    "weight_GB/s": gbs,
                    "of_read_bw": of_bw,
                    "ours_GFLOP/s": flops / (ours * 1e-3) / 1e9,
                    "numpy_GFLOP/s": flops / (base * 1e-3) / 1e9,
                }
                rows.append(row)
                settle()
    if a8 == "with":
        rows.extend(a8_rows(np, quantrs, rng, quick))
    rows.extend(bitsandbytes_rows(np, rng, [16, 128], quick))
    rows.append(probe_row(probe))
    return rows


def probe_row(probe) -> dict:
    """The last row: the median of every read probe of the run, and a triad."""
    return {
        "bench": f"machine read ({probe.kind}; triad {probe.triad():.1f} GB/s)",
        "ours_ms": None,
        "baseline": "",
        "baseline_ms": None,
        "ratio": None,
        "weight_GB/s": statistics.median(probe.read_values),
        "probe": probe.kind,
    }


def bitsandbytes_rows(np, rng, batches: list[int], quick: bool) -> list[dict]:
    """bitsandbytes' NF4 ``Linear4bit`` (float32 compute) on 4096x4096
    against NumPy float32, when bitsandbytes and PyTorch are installed (they
    are not requirements). Its CPU-packed kernel runs only on CPUs with
    AVX512-BF16; the row names which path ran."""
    try:
        import bitsandbytes as bnb
        import torch
    except ImportError:
        return []
    k = n = 4096
    w = rng.standard_normal((k, n), dtype=np.float32)
    lin = bnb.nn.Linear4bit(k, n, bias=False, compute_dtype=torch.float32, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(
        torch.from_numpy(np.ascontiguousarray(w.T)), requires_grad=False, quant_type="nf4"
    )
    lin = lin.to("cpu").eval()
    packed = bool(bnb.functional.has_avx512bf16())
    rows = []
    for b in batches:
        x = rng.standard_normal((b, k), dtype=np.float32)
        xt = torch.from_numpy(x)
        with torch.inference_mode():
            base, ours, ratio = paired_ms(
                lambda x=x: x @ w,
                lambda xt=xt: lin(xt),
                3 if quick else 5,
                2,
            )
        kind = "CPU-packed" if packed else "unpacked (no AVX512-BF16)"
        flops = 2.0 * b * k * n
        rows.append(
            {
                "bench": f"bitsandbytes nf4 {kind} {k}x{n} b{b}",
                "ours_ms": ours,
                "baseline": "numpy f32 x@W",
                "baseline_ms": base,
                "ratio": ratio,
                "ours_GFLOP/s": flops / (ours * 1e-3) / 1e9,
                "numpy_GFLOP/s": flops / (base * 1e-3) / 1e9,
            }
        )
        settle()
    return rows


COLUMNS = [
    "bench",
    "ours_ms",
    "baseline_ms",
    "ratio",
    "weight_GB/s",
    "of_read_bw",
    "ours_GFLOP/s",
    "numpy_GFLOP/s",
]


def main() -> None:
    reexec_without_openblas_overrides()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repeats")
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    a8 = ap.add_mutually_exclusive_group()
    a8.add_argument("--no-a8", action="store_true", help="skip the activations='int8' rows")
    a8.add_argument("--a8-only", action="store_true", help="only the activations='int8' rows")
    a8.add_argument(
        "--matvec",
        action="store_true",
        help="only batch 1 (INT4 float32 and int8 activations, g32 and g128; FP8 W8A32 and "
        "W8A8) on 4096x11008, 11008x4096 and SmolLM2's shapes, each against the read probe",
    )
    args = ap.parse_args()
    import quantrs

    if not args.json:
        print(f"quantrs {quantrs.build_info()}; {machine_note()}")
    mode = (
        "without" if args.no_a8 else "only" if args.a8_only else "matvec" if args.matvec else "with"
    )
    emit(run(args.quick, mode), COLUMNS, args.json)


if __name__ == "__main__":
    main()
