"""The 4-bit optimizer rows of benches/bench_gpu.py (docs/gpu.md), every ratio measured
in the same run:

- one AdamW step on 2^24 and 2^28 float32 parameters (one tensor) with
  ``quantrs.AdamW4bit`` on the device against ``torch.optim.AdamW(fused=True)`` and
  ``(foreach=True)`` on the same CUDA tensors: ms per step, state bytes per parameter,
  and GB/s over the bytes each step must move at least (quantrs: weight read and
  written, gradient read, state read and written, 12 + 2 x state B/param; torch:
  12 + 16 B/param) as a fraction of the device-to-device copy bandwidth;
- one step over a GPT-2-small-shaped parameter list (148 tensors, 124 M parameters);
- one QAT int4 step (``quantrs.QatOptimizer`` on the device: AdamW on a float32 master, per-tensor
  calibration, int4 fake quantization) on 2^24 and 2^26 parameters against the same loop
  in PyTorch (``torch.optim.AdamW(fused=True)`` then absmax / 7, round, clamp, rescale).

Every quantrs call returns when its result is complete (it checks the gradient for
NaN / inf on the device and reads the answer back first), so its time includes that
round trip; torch's is the queued kernel time. Times are medians of 5 event-timed runs.
"""

from __future__ import annotations

from typing import Callable


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    """The 148 parameter shapes of GPT-2 small (124 M parameters)."""
    d, ff, layers = 768, 3072, 12
    shapes: list[tuple[int, ...]] = [(50257, d), (1024, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,)]
        shapes += [(d,), (d,), (d, ff), (ff,), (ff, d), (d,)]
    return shapes + [(d,), (d,)]


def _ours(quantrs, ps, gs):
    opt = quantrs.AdamW4bit(1e-3, 0.9, 0.999, 1e-8, 0.01).to("cuda")

    def step():
        for i, (p, g) in enumerate(zip(ps, gs)):
            opt.update(p, g, name=str(i))
        opt.step()

    return opt, step


def _torch_step(torch, ps, gs, **kw):
    params = [torch.nn.Parameter(p.clone()) for p in ps]
    for p, g in zip(params, gs):
        p.grad = g
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw)
    return opt.step


def step_rows(torch, quantrs, copy_gbs: float, quick: bool, timer: Callable) -> list[dict]:
    """The rows; ``timer(torch, fn, iters)`` is bench_gpu's event timer (ms per call)."""
    rows = []
    sizes = [1 << 24] if quick else [1 << 24, 1 << 28]
    cases = [(f"AdamW step 2^{n.bit_length() - 1}", [(n,)]) for n in sizes]
    cases.append(("AdamW step GPT-2 small (148 tensors)", gpt2_small_shapes()))
    for name, shapes in cases:
        try:
            gen = torch.Generator(device="cuda").manual_seed(0)
            ps = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
            gs = [torch.randn(s, device="cuda", generator=gen) * 1e-3 for s in shapes]
            n = sum(p.numel() for p in ps)
            iters = 3 if n > 1 << 26 else 10
            opt, ours = _ours(quantrs, ps, gs)
            ours_ms = timer(torch, ours, iters)
            bpp = opt.memory_usage().total_bytes / n
            row = {"bench": name, "params": n, "ours_ms": ours_ms, "ours_state_b_per_param": bpp}
            row["ours_frac_copy"] = (12 + 2 * bpp) * n / (ours_ms * 1e-3) / 1e9 / copy_gbs
            del opt
            for kind in ("fused", "foreach"):
                ms = timer(torch, _torch_step(torch, ps, gs, **{kind: True}), iters)
                row[f"{kind}_ms"] = ms
                row[f"{kind}_frac_copy"] = 28 * n / (ms * 1e-3) / 1e9 / copy_gbs
            rows.append(row)
            del ps, gs
            torch.cuda.empty_cache()
        except Exception as e:  # a failing row is reported, the rest still runs
            rows.append({"bench": name, "error": repr(e)})
    return rows


def print_rows(rows: list[dict]) -> None:
    print(
        f"\n{'4-bit AdamW (quantrs.cuda)':38} {'params':>11} {'ms':>8} {'B/param':>8} "
        f"{'of copy':>8} {'fused ms':>9} {'x fused':>8} {'foreach ms':>11} {'x foreach':>9}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['bench']:38} ERROR {r['error']}")
            continue
        print(
            f"{r['bench']:38} {r['params']:>11} {r['ours_ms']:8.3f} "
            f"{r['ours_state_b_per_param']:8.3f} {r['ours_frac_copy']:8.2f} "
            f"{r['fused_ms']:9.3f} {r['fused_ms'] / r['ours_ms']:8.2f} "
            f"{r['foreach_ms']:11.3f} {r['foreach_ms'] / r['ours_ms']:9.2f}"
        )
    print(
        "(x fused / x foreach: torch's time over ours, > 1 = quantrs faster; torch.optim.AdamW "
        "keeps 8 B/param of state)"
    )


def _torch_qat_step(torch, p, g):
    """PyTorch's QAT int4 step: fused AdamW on the master, then symmetric per-tensor
    fake quantization into a view (the loop quantrs.QatOptimizer fuses on the device)."""
    master = torch.nn.Parameter(p.clone())
    master.grad = g
    opt = torch.optim.AdamW([master], lr=1e-3, weight_decay=0.01, fused=True)
    view = torch.empty_like(p)

    def step():
        opt.step()
        with torch.no_grad():
            scale = master.abs().max() / 7
            torch.clamp(torch.round(master / scale), -7, 7, out=view).mul_(scale)

    return step


def _ours_qat(quantrs, p, g):
    master = p.clone()
    cfg = quantrs.QatConfig("int4", lr=1e-3, weight_decay=0.01)
    opt = quantrs.QatOptimizer(master.cpu().numpy(), cfg, rng=0).to("cuda")
    return lambda: opt.step(master, g)


def qat_rows(torch, quantrs, quick: bool, timer: Callable) -> list[dict]:
    """The QAT int4 rows; ``timer`` as for :func:`step_rows`."""
    rows = []
    for n in [1 << 24] if quick else [1 << 24, 1 << 26]:
        name = f"QAT int4 step 2^{n.bit_length() - 1}"
        try:
            gen = torch.Generator(device="cuda").manual_seed(0)
            p = torch.randn(n, device="cuda", generator=gen)
            g = torch.randn(n, device="cuda", generator=gen) * 1e-3
            ours_ms = timer(torch, _ours_qat(quantrs, p, g), 10)
            torch_ms = timer(torch, _torch_qat_step(torch, p, g), 10)
            rows.append({"bench": name, "params": n, "ours_ms": ours_ms, "torch_ms": torch_ms})
            del p, g
            torch.cuda.empty_cache()
        except Exception as e:  # a failing row is reported, the rest still runs
            rows.append({"bench": name, "error": repr(e)})
    return rows


def print_qat_rows(rows: list[dict]) -> None:
    print(
        f"\n{'QAT (quantrs.QatOptimizer, cuda)':38} {'params':>11} {'ms':>8} {'torch ms':>9} "
        f"{'x torch':>8}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['bench']:38} ERROR {r['error']}")
            continue
        print(
            f"{r['bench']:38} {r['params']:>11} {r['ours_ms']:8.3f} {r['torch_ms']:9.3f} "
            f"{r['torch_ms'] / r['ours_ms']:8.2f}"
        )
    print(
        "(torch: fused AdamW + absmax / round / clamp / rescale on the master; x torch > 1 = "
        "quantrs faster; quantrs' time includes reading the calibration range back)"
    )
