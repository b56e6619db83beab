"""quantrs.torch in a real PyTorch loop, on the CPU (docs/torch.md).

1. Optimizer step on a GPT-2-small-shaped model (124 M parameters in 148 tensors: token
   and position embeddings, 12 blocks of LayerNorm + Linear 768x2304 / 768x768 /
   768x3072 / 3072x768, a final LayerNorm, the head tied to the embedding): gradients from
   one real forward/backward, then the optimizers stepped in alternation on the same
   parameters, median step time and optimizer-state bytes per parameter each.
   ``torch.optim.AdamW`` foreach is the baseline; fused, torchao ``AdamW4bit`` /
   ``AdamW8bit`` (first step, compile included, reported apart) and bitsandbytes
   ``AdamW8bit`` join when importable.
2. Convergence: the demo's digits MLP (64-64-10, 50 epochs of batch 32, lr 2e-3, weight
   decay 1e-4; ``quantrs demo``) trained in torch with each optimizer from the same
   initial weights and batch order, final full-train-set loss against torch AdamW's; and
   a full-batch MLP regression (300 steps) where 4-bit state can lag float32 late. Both
   run with one torch thread (tiny tensors), the rest with the same thread count for all.
3. ``quantize_``d inference of the 12 blocks (int4 g32, fp8 e4m3) at batch 1 and 32
   against the float32 blocks, alternating.

Run: python benches/bench_torch.py [--quick] [--json] [--threads N]
--quick: a 4-block, width-256 model, 10 epochs of digits, 100 regression steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BASELINE = "torch.optim.AdamW (foreach)"


# ---- the model ---------------------------------------------------------------------------


def gpt2_like(width=768, layers=12, vocab=50257, ctx=1024):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width)
            self.c_fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)

        def forward(self, h):
            # A stack of linears: the value third of c_attn stands in for attention.
            v = self.c_attn(self.ln_1(h))[..., 2 * width :]
            h = h + self.c_proj(v)
            return h + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(h))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(ctx, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width)

        def forward(self, ids):
            pos = torch.arange(ids.shape[-1])
            h = self.blocks(self.wte(ids) + self.wpe(pos))
            return self.ln_f(h) @ self.wte.weight.t()

    return Model()


def _importable(name):
    try:
        __import__(name)
        return True
    except Exception:
        return False


def _tensor_bytes(t):
    """Bytes a tensor holds; a tensor subclass (torchao's quantized state) by its inner
    tensors, not by its logical float32 shape."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def _state_bytes(opt):
    if hasattr(opt, "state_bytes"):
        return opt.state_bytes()
    import torch

    return sum(
        _tensor_bytes(v)
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor)
    )


def step_rows(quick):
    import torch

    import quantrs.torch as qt

    shape = dict(width=256, layers=4, vocab=8192, ctx=128) if quick else {}
    torch.manual_seed(0)
    model = gpt2_like(**shape)
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    ids = torch.randint(0, 1000, (1, 16))
    logits = model(ids)
    torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()

    makers = {
        BASELINE: lambda: torch.optim.AdamW(params, lr=1e-4, foreach=True),
        "torch.optim.AdamW (fused)": lambda: torch.optim.AdamW(params, lr=1e-4, fused=True),
        "quantrs.torch.AdamW4bit": lambda: qt.AdamW4bit(params, lr=1e-4),
    }
    notes = {}
    if _importable("torchao.optim"):
        import torchao.optim as ao

        makers["torchao AdamW4bit"] = lambda: ao.AdamW4bit(params, lr=1e-4)
        makers["torchao AdamW8bit"] = lambda: ao.AdamW8bit(params, lr=1e-4)
    else:
        notes["torchao AdamW4bit / AdamW8bit"] = "not importable"
    if _importable("bitsandbytes"):
        import bitsandbytes as bnb

        makers["bitsandbytes AdamW8bit"] = lambda: bnb.optim.AdamW8bit(params, lr=1e-4)
    else:
        notes["bitsandbytes AdamW8bit"] = "not importable"

    opts, first = {}, {}
    for name, make in makers.items():
        try:
            opts[name] = make()
            t0 = time.perf_counter()
            opts[name].step()  # state allocation (and compilation where there is one)
            first[name] = 1e3 * (time.perf_counter() - t0)
        except Exception as e:  # an importable package that cannot run here
            notes[name] = f"failed: {type(e).__name__}: {str(e)[:80]}"
            opts.pop(name, None)
    rounds = 3 if quick else 5
    times = {name: [] for name in opts}
    for _ in range(rounds):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            opt.step()
            times[name].append(1e3 * (time.perf_counter() - t0))
    base = statistics.median(times[BASELINE])
    from _bandwidth import bandwidth

    bw = bandwidth(torch.get_num_threads())
    rows = []
    for name in opts:
        ms = statistics.median(times[name])
        state_bpp = _state_bytes(opts[name]) / n
        row = {
            "bench": f"{name} step, {len(params)} tensors {n / 1e6:.1f}M params",
            "ours_ms": ms,
            "baseline": BASELINE,
            "baseline_ms": base,
            "ratio": base / ms,
            "state_B_per_param": state_bpp,
            "first_step_ms": first[name],
            # The least traffic of an Adam step (param in and out, grad in: 12 B, the state
            # in and out) over its time, and the machine's bandwidth (benches/_bandwidth.py).
            "step_GBps": (12 + 2 * state_bpp) * n / (ms * 1e-3) / 1e9,
            "read_GBps": bw["read_GBps"],
            "triad_GBps": bw["triad_GBps"],
        }
        rows.append(row)
    for name, note in notes.items():
        rows.append({"bench": f"{name} step", "ours_ms": None, "note": note})
    return rows


# ---- convergence -------------------------------------------------------------------------


def _digits():
    import torch

    from quantrs.cli._mlp import load_digits

    xtr, ytr, xte, yte = load_digits()
    return [torch.from_numpy(a) for a in (xtr, ytr, xte, yte)]


def _optimizers():
    import torch

    import quantrs.torch as qt

    return {
        "torch.optim.AdamW": lambda p, lr, wd: torch.optim.AdamW(p, lr=lr, weight_decay=wd),
        "quantrs.torch.AdamW4bit": lambda p, lr, wd: qt.AdamW4bit(p, lr=lr, weight_decay=wd),
        "quantrs.torch.QatAdamW int8": lambda p, lr, wd: qt.QatAdamW(
            p, "int8", lr=lr, weight_decay=wd
        ),
    }


class _one_thread:
    """Tiny tensors: one intra-op thread (OpenMP threads only add spin-waits there)."""

    def __enter__(self):
        import torch

        self.n = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.n)


def digits_rows(quick):
    with _one_thread():
        return _digits_rows(quick)


def _digits_rows(quick):
    import torch

    xtr, ytr, xte, yte = _digits()
    epochs = 10 if quick else 50
    rows, ref = [], None
    for name, make in _optimizers().items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        opt = make(model.parameters(), 2e-3, 1e-4)
        order = torch.Generator().manual_seed(1)
        t0 = time.perf_counter()
        for _ in range(epochs):
            perm = torch.randperm(len(ytr), generator=order)
            for b in range(0, len(ytr), 32):
                idx = perm[b : b + 32]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
                opt.step()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            train = torch.nn.functional.cross_entropy(model(xtr), ytr).item()
            out = model(xte)
            test = torch.nn.functional.cross_entropy(out, yte).item()
            acc = (out.argmax(1) == yte).float().mean().item() * 100
        ref = train if ref is None else ref
        rows.append(
            {
                "bench": f"{name} digits MLP {epochs} epochs",
                "train_loss": train,
                "vs_torch_AdamW": f"{100 * (train / ref - 1):+.1f} %",
                "test_loss": test,
                "test_acc_%": acc,
                "seconds": seconds,
            }
        )
    return rows


def regression_rows(quick):
    with _one_thread():
        return _regression_rows(quick)


def _regression_rows(quick):
    import torch

    steps = 100 if quick else 300
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=g)
    y = torch.sin(x @ torch.randn(32, 8, generator=g)) + 0.05 * torch.randn(512, 8, generator=g)
    rows, ref = [], None
    for name, make in _optimizers().items():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8)
        )
        opt = make(model.parameters(), 3e-3, 1e-2)
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        final = loss.item()
        ref = final if ref is None else ref
        rows.append(
            {
                "bench": f"{name} full-batch MLP regression {steps} steps",
                "train_loss": final,
                "vs_torch_AdamW": f"{100 * (final / ref - 1):+.1f} %",
            }
        )
    return rows


# ---- inference ---------------------------------------------------------------------------


def inference_rows(quick):
    import copy

    import torch

    import quantrs.torch as qt

    shape = dict(width=256, layers=4, vocab=8192, ctx=128) if quick else {}
    torch.manual_seed(0)
    blocks = gpt2_like(**shape).blocks.eval()
    width = blocks[0].c_proj.in_features
    rows = []
    for method in ("int4", "fp8"):
        q = qt.quantize_(copy.deepcopy(blocks), method)
        for batch in (1, 32):
            x = torch.randn(batch, width)
            with torch.no_grad():
                ref = blocks(x)
                rel = float((q(x) - ref).norm() / ref.norm())
                fb, fq = [], []
                for _ in range(5 if quick else 15):
                    t0 = time.perf_counter()
                    blocks(x)
                    t1 = time.perf_counter()
                    q(x)
                    fq.append(time.perf_counter() - t1)
                    fb.append(t1 - t0)
            b, o = 1e3 * statistics.median(fb), 1e3 * statistics.median(fq)
            rows.append(
                {
                    "bench": f"{len(blocks)} blocks {method} batch {batch}",
                    "ours_ms": o,
                    "baseline": "torch float32 nn.Linear",
                    "baseline_ms": b,
                    "ratio": b / o,
                    "rel_err": rel,
                }
            )
    return rows


def run(quick: bool) -> list[dict]:
    if not _importable("torch"):
        return [{"bench": "torch", "ours_ms": None, "note": "torch not importable"}]
    return step_rows(quick) + digits_rows(quick) + regression_rows(quick) + inference_rows(quick)


def _print(rows):
    from _common import print_table

    groups = {}
    for r in rows:
        groups.setdefault(tuple(k for k in r), []).append(r)
    for cols, rs in groups.items():
        print_table(rs, list(cols))
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    if _importable("torch"):
        import torch

        torch.set_num_threads(args.threads or os.cpu_count() or 1)
        threads = torch.get_num_threads()
    else:
        threads = None
    rows = run(args.quick)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    from _common import machine_note

    print(
        f"{machine_note()}; torch threads: {threads}; RAYON_NUM_THREADS: "
        f"{os.environ.get('RAYON_NUM_THREADS', 'all cores')}\n"
    )
    _print(rows)


if __name__ == "__main__":
    main()
