"""The convergence suite: every task with float32 AdamW (the NumPy reference, and
``torch.optim.AdamW`` when torch is importable) and ``AdamW4bit`` variants at the same
hyper-parameters, from the same initial weights and batches.

Per task and optimizer it prints the final loss (mean of the last 100 per-step losses),
its gap to float32 AdamW's, the worst gap over the run (means of 100-step windows), and
the task's test metric. The bar (docs/optim-convergence.md): the default ``AdamW4bit``
within 3 % of float32 AdamW's final loss on every task (lower is fine).

Run: python benches/convergence/run.py [--quick] [--variants] [--tasks a,b] [--steps N] [--json]
--quick: a fifth of the steps (the tests' size); --variants: also the state variants of
the diagnosis (no double quantization, rank-1 v, int8 m, block 128, other v maps).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# One BLAS thread: the models are small, and an idle OpenBLAS pool competes for the cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from convergence import harness as H  # noqa: E402
from convergence.tasks import TASKS  # noqa: E402

#: Name -> AdvancedQuantizationConfig keywords of each AdamW4bit variant.
VARIANTS = {
    "4bit default": {},
    "4bit double_quantization=False": {"double_quantization": False},
    "4bit rank1_normalization=True": {"rank1_normalization": True},
    "4bit block_size=128": {"block_size": 128},
    "4bit method=int8": {"method": "int8"},
    "4bit variance_map=linear": {"variance_map": "linear"},
    "4bit variance_map=sqrt_log": {"variance_map": "sqrt_log"},
}

BAR = 0.03


def run_task(task, variants, steps=None, torch=False):
    """Rows of one task: float32 first, then torch, then each variant."""
    base, metric, sec = H.train(task, H.make_optimizer("float32", task), steps)
    fb = H.final_loss(base)
    rows = [dict(task=task.name, opt="float32 AdamW (NumPy)", final=fb, gap=0.0, worst=0.0,
                 metric=metric, seconds=sec)]  # fmt: skip
    runs = [("torch.optim.AdamW", lambda: H.make_optimizer("torch", task))] if torch else []
    runs += [(k, lambda q=q: H.make_optimizer("4bit", task, **q)) for k, q in variants.items()]
    for name, make in runs:
        curve, metric, sec = H.train(task, make(), steps)
        f = H.final_loss(curve)
        rows.append(dict(task=task.name, opt=name, final=f, gap=f / fb - 1,
                         worst=H.worst_gap(curve, base), metric=metric, seconds=sec))  # fmt: skip
    return rows


HEADER = (
    "| task | optimizer | final loss | vs float32 | worst gap | test metric | s |\n"
    "|---|---|---|---|---|---|---|"
)


def print_rows(rows):
    for r in rows:
        flag = " **over**" if r["opt"] == "4bit default" and r["gap"] > BAR else ""
        print(
            f"| {r['task']} | {r['opt']} | {r['final']:.5g} | {100 * r['gap']:+.1f} %{flag} | "
            f"{100 * r['worst']:+.1f} % | {r['metric']:.4g} | {r['seconds']:.0f} |",
            flush=True,
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a fifth of the steps")
    ap.add_argument("--variants", action="store_true", help="also the diagnosis variants")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of " + ",".join(TASKS))
    ap.add_argument("--json", action="store_true", help="print only a JSON list of rows")
    ap.add_argument("--steps", type=int, default=None, help="train every task this many steps")
    a = ap.parse_args(argv)
    names = a.tasks.split(",") if a.tasks else list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        ap.error(f"--tasks: unknown {unknown}; expected names from {list(TASKS)}")
    variants = VARIANTS if a.variants else {"4bit default": {}}
    torch = H.torch_available()
    if not a.json:
        simd = os.environ.get("QUANTRS_SIMD", "best available")
        print(f"QUANTRS_SIMD: {simd}; torch.optim.AdamW: {'yes' if torch else 'not installed'}\n")
        print(HEADER)
    rows = []
    for name in names:
        task = TASKS[name]()
        steps = max(200, task.steps // 5) if a.quick else a.steps
        task_rows = run_task(task, variants, steps, torch)
        rows += task_rows
        if not a.json:
            print_rows(task_rows)
    if a.json:
        print(json.dumps(rows, indent=1))
    over = [r for r in rows if r["opt"] == "4bit default" and r["gap"] > BAR]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
