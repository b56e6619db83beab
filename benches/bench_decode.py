"""A transformer-like decode step, timed the way a model runs it.

    python benches/bench_decode.py [--layers 2] [--rounds 5] [--batches 1,4,16]
                                   [--variants ...] [--json] [--keep-env]

Per layer: RMSNorm, q/k/v/o projections 4096x4096, attention of the step's
queries over a 512-token KV cache (32 heads of 128, in NumPy, so BLAS runs
between the projections), RMSNorm, gate/up 4096x11008, SiLU, down 11008x4096,
residual adds. The layers are distinct, so a step streams every weight from
memory once (2 layers: 1.6 GB of float32, 0.23 GB of INT4 g32, 0.4 GB of FP8;
the last-level cache is tens of MiB).

Variants, differing only in the seven linears of each layer:

- ``numpy``: float32 ``W @ x`` at batch 1 (a 1-D GEMV, NumPy's fastest path
  for it), ``x @ W.T`` above, ``W`` stored ``[out, in]``;
- ``int4-g32``, ``int4-g128``: ``QuantizedWeight.matvec`` / ``matmul``;
- ``int4-g32-a8`` (INT4 g32 A8): the same with ``activations="int8"`` (the
  activations quantized per group to int8, integer dot products);
- ``fp8-w8a32``, ``fp8-w8a8``: ``PerTensorFP8Linear.forward`` weight-only and
  with a static activation scale (calibrated per linear on one NumPy step:
  2 x absmax / 448).

Every array is float32 (``np.float32`` constants; a float64 scalar would
promote the activations and NumPy would then upcast every weight). One round
runs one step of every variant in turn; rounds repeat ``--rounds`` times after
a warm-up round. Per variant: the step time, the time inside the linears, the
weight bytes they read per second, and the ratio of NumPy's linear (and step)
time to the variant's, the median of the per-round ratios.

``--threads N`` caps quantrs's small-batch kernels at N threads
(``quantrs.threads(N)``) for the whole run; without it quantrs's default
applies. ``--torch`` runs the same step written with torch tensors:
``nn.Linear`` float32 (the baseline) against ``quantrs.torch.Int4Linear`` g32
and g128, torch's own ops (and its OpenMP pool) between the calls.

The machine's 2-thread read and triad bandwidth (``benches/_bandwidth.py``)
is probed after every round; ``of_read_bw`` is the variant's weight bytes per
second in the linears over the read rate of the same round (the median of the
per-round fractions), so batch-1 rows show how close a kernel is to the
memory limit under the step's real conditions.

``--foreign-threads N`` runs the quantrs variants' steps under
``quantrs.foreign_threads(N)`` (NumPy's BLAS and torch's OpenMP pool capped at N
threads; the baseline keeps the defaults), and ``--settle`` runs untimed steps of the
same variant for at least 0.15 s before each timed one, so that the timed step
follows its own kind as in a loop that runs one model (without it, it follows the
previous variant's step and whatever that left spinning for ~0.1 s).

``--openblas-threads N`` sets ``OPENBLAS_NUM_THREADS`` before NumPy loads and
``--openblas-timeout T`` OpenBLAS's ``OPENBLAS_THREAD_TIMEOUT`` (log2 of the
cycles a pool thread spins after a call before sleeping, 4..30); see
docs/benchmarks.md ("A decode step") for what they do to the step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bandwidth import Bandwidth  # noqa: E402
from _common import emit, machine_note, reexec_without_openblas_overrides  # noqa: E402

D, FF, HEADS, CTX = 4096, 11008, 32, 512
HEAD_DIM = D // HEADS
PROJ = ("q", "k", "v", "o", "gate", "up", "down")
VARIANTS = ("numpy", "int4-g32", "int4-g128", "int4-g32-a8", "fp8-w8a32", "fp8-w8a8")
TORCH_VARIANTS = ("torch", "torch-int4-g32", "torch-int4-g128")


def _shape(name: str) -> tuple[int, int]:
    """(out, in) of a projection."""
    if name in ("gate", "up"):
        return FF, D
    if name == "down":
        return D, FF
    return D, D


class Timed:
    """The seven linears of every layer for one variant, timing each call."""

    def __init__(self, variant: str, fns: list[dict], nbytes: int) -> None:
        self.variant, self.fns, self.nbytes, self.spent = variant, fns, nbytes, 0.0

    def __call__(self, layer: int, name: str, x):
        t0 = time.perf_counter()
        y = self.fns[layer][name](x)
        self.spent += time.perf_counter() - t0
        return y


def build(np, variants, layers: int, rng):
    """Float weights per layer, then each variant's linears built from them."""
    import quantrs

    w32 = []
    for _ in range(layers):
        ws = {}
        for name in PROJ:
            out, inp = _shape(name)
            ws[name] = rng.standard_normal((out, inp), dtype=np.float32) * np.float32(
                1 / np.sqrt(inp)
            )
        w32.append(ws)
    kv = [
        (
            rng.standard_normal((HEADS, CTX, HEAD_DIM), dtype=np.float32),
            rng.standard_normal((HEADS, CTX, HEAD_DIM), dtype=np.float32),
        )
        for _ in range(layers)
    ]
    norms = [
        (
            (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
            (1 + 0.1 * rng.standard_normal(D)).astype(np.float32),
        )
        for _ in range(layers)
    ]
    linears = {}
    if "numpy" in variants:

        def np_lin(w):
            return lambda x: w @ x if x.ndim == 1 else x @ w.T

        fns = [{n: np_lin(ws[n]) for n in PROJ} for ws in w32]
        linears["numpy"] = Timed("numpy", fns, sum(w.nbytes for ws in w32 for w in ws.values()))
    for v, gs, act in (
        ("int4-g32", 32, "float32"),
        ("int4-g128", 128, "float32"),
        ("int4-g32-a8", 32, "int8"),
    ):
        if v not in variants:
            continue
        fns, nbytes = [], 0
        for ws in w32:
            layer = {}
            for n in PROJ:
                qw = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(ws[n].T), group_size=gs)
                nbytes += qw.nbytes
                layer[n] = lambda x, qw=qw, a=act: (
                    qw.matvec(x, activations=a) if x.ndim == 1 else qw.matmul(x, activations=a)
                )
            fns.append(layer)
        linears[v] = Timed(v, fns, nbytes)
    fp8 = [v for v in ("fp8-w8a32", "fp8-w8a8") if v in variants]
    scales = calibrate(np, w32, kv, norms) if "fp8-w8a8" in variants else None
    for v in fp8:
        fns = []
        for li, ws in enumerate(w32):
            layer = {}
            for n in PROJ:
                a = scales[li][n] if v == "fp8-w8a8" else None
                lin = quantrs.PerTensorFP8Linear.from_float(ws[n], activation_scale=a)
                layer[n] = lin.forward
            fns.append(layer)
        linears[v] = Timed(v, fns, sum(w.size for ws in w32 for w in ws.values()))
    return w32, kv, norms, linears


def calibrate(np, w32, kv, norms) -> list[dict]:
    """Static activation scales for W8A8: 2 x absmax / 448 of each linear's
    input over one float32 step at batch 16."""
    amax = [dict.fromkeys(PROJ, 0.0) for _ in w32]

    def lin(layer, name, x):
        amax[layer][name] = max(amax[layer][name], float(np.abs(x).max()))
        return x @ w32[layer][name].T

    x = np.random.default_rng(1).standard_normal((16, D), dtype=np.float32)
    step(np, lin, kv, norms, x)
    return [{n: float(np.float32(2 * a / 448)) for n, a in layer.items()} for layer in amax]


def rmsnorm(np, x, g):
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return x * (np.float32(1) / np.sqrt(ms + np.float32(1e-6))) * g


def attention(np, q, k_cache, v_cache):
    """One new query per batch row over the shared cache (speculative
    decoding's shape): scores and the weighted sum are BLAS calls."""
    b = q.shape[0]
    qh = q.reshape(b, HEADS, HEAD_DIM).transpose(1, 0, 2)  # [H, b, hd]
    s = np.matmul(qh, k_cache.transpose(0, 2, 1))  # [H, b, CTX]
    s *= np.float32(1 / np.sqrt(HEAD_DIM))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = np.matmul(s, v_cache)  # [H, b, hd]
    return np.ascontiguousarray(o.transpose(1, 0, 2)).reshape(b, D)


def step(np, lin, kv, norms, x):
    """One decode step over every layer; `x` is [b, D] (or [D] at batch 1)."""
    one = x.ndim == 1
    h = x
    for layer, ((kc, vc), (g1, g2)) in enumerate(zip(kv, norms)):
        a = rmsnorm(np, h, g1)
        q = lin(layer, "q", a)
        k = lin(layer, "k", a)
        v = lin(layer, "v", a)
        # The new token's key and value take the cache's last slot.
        kc[:, -1, :] = (k if one else k[-1]).reshape(HEADS, HEAD_DIM)
        vc[:, -1, :] = (v if one else v[-1]).reshape(HEADS, HEAD_DIM)
        att = attention(np, q.reshape(-1, D), kc, vc)
        h = h + lin(layer, "o", att[0] if one else att)
        a = rmsnorm(np, h, g2)
        gate = lin(layer, "gate", a)
        up = lin(layer, "up", a)
        act = gate / (np.float32(1) + np.exp(-gate)) * up
        h = h + lin(layer, "down", act)
    assert h.dtype == np.float32, h.dtype
    return h


def build_torch(np, torch, variants, layers: int, rng):
    """The NumPy loop's weights, cache and norms as torch tensors; the
    linears are ``nn.Linear`` (float32) and ``quantrs.torch.Int4Linear``."""
    from quantrs.torch import Int4Linear

    w32, kv, norms, _ = build(np, (), layers, rng)
    kv = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in kv]
    norms = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in norms]
    dense = []
    for ws in w32:
        layer = {}
        for n in PROJ:
            out, inp = _shape(n)
            lin = torch.nn.Linear(inp, out, bias=False)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(ws[n]))
            layer[n] = lin
        dense.append(layer)
    linears = {}
    if "torch" in variants:
        nbytes = sum(w.nbytes for ws in w32 for w in ws.values())
        linears["torch"] = Timed("torch", dense, nbytes)
    for v, gs in (("torch-int4-g32", 32), ("torch-int4-g128", 128)):
        if v in variants:
            fns = [
                {n: Int4Linear.from_linear(m, group_size=gs) for n, m in d.items()} for d in dense
            ]
            nbytes = sum(m.quantized_weight().nbytes for d in fns for m in d.values())
            linears[v] = Timed(v, fns, nbytes)
    return w32, kv, norms, linears


def step_torch(torch, lin, kv, norms, x):
    """`step` written with torch tensors and ops (no NumPy between calls)."""
    one = x.ndim == 1
    h = x
    with torch.no_grad():
        for layer, ((kc, vc), (g1, g2)) in enumerate(zip(kv, norms)):
            a = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * g1
            q = lin(layer, "q", a)
            k = lin(layer, "k", a)
            v = lin(layer, "v", a)
            kc[:, -1, :] = (k if one else k[-1]).reshape(HEADS, HEAD_DIM)
            vc[:, -1, :] = (v if one else v[-1]).reshape(HEADS, HEAD_DIM)
            b = q.reshape(-1, D).shape[0]
            qh = q.reshape(b, HEADS, HEAD_DIM).transpose(0, 1)
            s = torch.softmax(qh @ kc.transpose(1, 2) / HEAD_DIM**0.5, dim=-1)
            att = (s @ vc).transpose(0, 1).reshape(b, D)
            h = h + lin(layer, "o", att[0] if one else att)
            a = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * g2
            gate = lin(layer, "gate", a)
            up = lin(layer, "up", a)
            h = h + lin(layer, "down", torch.nn.functional.silu(gate) * up)
    assert h.dtype == torch.float32, h.dtype
    return h


# Longer than OpenBLAS's default spin after a call (2^28 cycles, ~0.1 s), so that what the
# previous variant left spinning has stopped before a settled step is timed.
SETTLE_S = 0.15


def run(
    layers: int,
    rounds: int,
    batches: list[int],
    variants: list[str],
    torch_loop: bool = False,
    foreign: int | None = None,
    settle: bool = False,
) -> list[dict]:
    import numpy as np

    import quantrs

    rng = np.random.default_rng(0)
    if torch_loop:
        import torch

        w32, kv, norms, linears = build_torch(np, torch, variants, layers, rng)
        step_fn, base = (lambda _np, *a: step_torch(torch, *a)), "torch"
        x_of = torch.from_numpy
    else:
        w32, kv, norms, linears = build(np, variants, layers, rng)
        step_fn, base = step, "numpy"
        x_of = lambda a: a  # noqa: E731
    bw = Bandwidth(np)
    if base not in linears:
        raise SystemExit(f"the {base} variant is the baseline: keep it in --variants")
    rows = []
    for b in batches:
        x = rng.standard_normal((b, D), dtype=np.float32)
        if b == 1:
            x = x[0]
        x = x_of(x)
        step_t = {v: [] for v in linears}
        lin_t = {v: [] for v in linears}
        read_bw: list[float] = []
        for r in range(rounds + 1):
            for v, lin in linears.items():
                cap = quantrs.foreign_threads(foreign) if foreign and v != base else None
                if settle:  # the steps before the timed one are the same variant's, as in a loop
                    t_end = time.perf_counter() + SETTLE_S
                    while True:
                        step_fn(np, lin, kv, norms, x)
                        if time.perf_counter() >= t_end:
                            break
                lin.spent = 0.0
                t0 = time.perf_counter()
                step_fn(np, lin, kv, norms, x)
                dt = time.perf_counter() - t0
                if cap is not None:
                    cap.restore()
                if r > 0:  # round 0 warms every path
                    step_t[v].append(dt)
                    lin_t[v].append(lin.spent)
            if r > 0 and b == 1:
                read_bw.append(bw.read())
        for v, lin in linears.items():
            lin_ms = 1e3 * statistics.median(lin_t[v])
            rows.append(
                {
                    "variant": v,
                    "batch": b,
                    "step_ms": 1e3 * statistics.median(step_t[v]),
                    "linears_ms": lin_ms,
                    "weight_GB/s": lin.nbytes / (lin_ms * 1e-3) / 1e9,
                    "of_read_bw": statistics.median(
                        lin.nbytes / t / 1e9 / r for t, r in zip(lin_t[v], read_bw)
                    )
                    if read_bw
                    else None,
                    "linears_ratio": statistics.median(
                        n / o for n, o in zip(lin_t[base], lin_t[v])
                    ),
                    "step_ratio": statistics.median(n / o for n, o in zip(step_t[base], step_t[v])),
                    "weight_MB": lin.nbytes / 1e6,
                }
            )
    if bw.read_values:
        rows.append(
            {
                "variant": f"machine read ({bw.kind}; triad {bw.triad():.1f} GB/s)",
                "weight_GB/s": bw.summary()["read_GB/s"],
            }
        )
    return rows


COLUMNS = [
    "variant",
    "batch",
    "step_ms",
    "linears_ms",
    "weight_GB/s",
    "of_read_bw",
    "linears_ratio",
    "step_ratio",
    "weight_MB",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2, help="distinct layers (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    ap.add_argument("--batches", default="1,4,16", help="comma-separated (default 1,4,16)")
    ap.add_argument("--variants", help="comma-separated (default: all of the loop)")
    ap.add_argument("--openblas-threads", type=int, help="set OPENBLAS_NUM_THREADS")
    ap.add_argument("--openblas-timeout", type=int, help="set OPENBLAS_THREAD_TIMEOUT (4..30)")
    ap.add_argument("--threads", type=int, help="quantrs.threads(N) for the whole run")
    ap.add_argument("--torch", action="store_true", help="the step in torch tensors")
    ap.add_argument(
        "--foreign-threads",
        type=int,
        help="quantrs.foreign_threads(N) around the quantrs variants' steps",
    )
    ap.add_argument(
        "--settle",
        action="store_true",
        help="untimed steps of the same variant (>= 0.15 s) before each timed one",
    )
    ap.add_argument("--json", action="store_true", help="print JSON rows")
    ap.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_* overrides")
    args = ap.parse_args()
    # Before NumPy (and so OpenBLAS) loads: they are read once, at load.
    if args.openblas_threads is not None:
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.openblas_threads)
    if args.openblas_timeout is not None:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(args.openblas_timeout)
    reexec_without_openblas_overrides()
    import numpy as np

    import quantrs

    known = TORCH_VARIANTS if args.torch else VARIANTS
    variants = [v for v in (args.variants or ",".join(known)).split(",") if v]
    unknown = sorted(set(variants) - set(known))
    if unknown:
        ap.error(f"--variants: unknown {unknown}, expected some of {list(known)}")
    if args.threads is not None:
        quantrs.threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    if not args.json:
        blas = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
        print(
            f"quantrs {quantrs.build_info()}; numpy {np.__version__}; "
            f"{blas or 'OpenBLAS defaults'}; quantrs threads {quantrs.num_threads()}; "
            f"{'torch' if args.torch else 'numpy'} loop; {args.layers} layers; "
            f"foreign_threads {args.foreign_threads}; settle {args.settle}; {machine_note()}"
        )
    rows = run(
        args.layers,
        args.rounds,
        batches,
        variants,
        args.torch,
        args.foreign_threads,
        args.settle,
    )
    emit(rows, COLUMNS, args.json)


if __name__ == "__main__":
    main()
