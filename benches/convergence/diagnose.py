"""The diagnosis of docs/optim-convergence.md, on the NumPy model of the state
(``simulate.py``): no extension build needed.

Run: python benches/convergence/diagnose.py [--task issue_mlp|all] ablation [SPEC ...]
     python benches/convergence/diagnose.py ratchet [--task long_mlp] [--steps 3000]

``ablation`` trains the task with float32 AdamW and with the model under each SPEC, a
comma-separated list of ``SimAdamW4bit`` keywords (e.g. ``"v_scales='f32'"``,
``"exact='v',method='int8'"``); without SPECs, the table of the doc; ``--task all`` runs
every task of the suite in turn, a table each. ``ratchet`` prints,
per v-scale rounding, the median over the first layer's blocks of the stored v scale over
the block maximum of a float32 v fed the same gradients (``sqrt(v)`` domain).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from convergence import harness as H  # noqa: E402
from convergence import simulate as S  # noqa: E402
from convergence.tasks import TASKS  # noqa: E402

ABLATION = [
    "",
    "m_scales='f32', v_scales='f32'",
    "m_scales='f32'",
    "v_scales='f32'",
    "v_scales='dq_nearest'",
    "v_scales='dq_stochastic'",
    "m_scales='dq_stochastic', v_scales='dq_stochastic'",
    "exact='v'",
    "exact='m', v_scales='f32'",
    "exact='v', method='int8'",
]


def ablation(task, specs):
    base, _, _ = H.train(task, H.make_optimizer("float32", task))
    fb = H.final_loss(base)
    print("| model knobs | final loss | vs float32 | worst gap |\n|---|---|---|---|")
    print(f"| float32 AdamW | {fb:.5g} | - | - |")
    for spec in specs:
        kw = eval(f"dict({spec})")  # the SPECs are this script's own command-line input
        sim = S.SimAdamW4bit(task.lr, task.weight_decay, **kw)
        curve, _, _ = H.train(task, H.Split(sim, task.lr, task.weight_decay))
        f = H.final_loss(curve)
        print(
            f"| {spec or 'format 1'} | {f:.5g} | {100 * (f / fb - 1):+.1f} % | "
            f"{100 * H.worst_gap(curve, base):+.1f} % |",
            flush=True,
        )


def ratchet(task, steps, layer="W0", at=(300, 1000, 3000)):
    at = [s for s in at if s <= steps] or [steps]
    print("| v scale rounding | " + " | ".join(f"step {s}" for s in at) + " |")
    print("|---|" + "---|" * len(at))
    for fmt in ("dq_up", "dq_nearest", "dq_stochastic", "f32"):
        sim = S.SimAdamW4bit(task.lr, task.weight_decay, v_scales=fmt)
        opt = H.Split(sim, task.lr, task.weight_decay)
        p, cells = task.init(), []
        for i, idx in enumerate(task.batches(steps)):
            _, g = task.loss_grad(p, idx)
            for k in p:
                opt.update(p[k], np.ascontiguousarray(g[k], np.float32), name=k)
            opt.step()
            if i + 1 in at:
                exact = np.sqrt(sim.shadow_v[layer])
                pad = (-exact.size) % sim.bs
                block_max = np.pad(exact, (0, pad)).reshape(-1, sim.bs).max(1)
                stored = sim.state[layer][3]
                ok = block_max > 0
                cells.append(f"{np.median(stored[ok] / block_max[ok]):.2f}")
        print(f"| {fmt} | " + " | ".join(cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("what", choices=["ablation", "ratchet"])
    ap.add_argument("specs", nargs="*")
    ap.add_argument("--task", default=None, choices=[*TASKS, "all"])
    ap.add_argument("--steps", type=int, default=3000)
    a = ap.parse_args()
    if a.what == "ablation":
        names = list(TASKS) if a.task == "all" else [a.task or "issue_mlp"]
        for name in names:
            if len(names) > 1:
                print(f"\n{name}\n", flush=True)
            ablation(TASKS[name](), a.specs or ABLATION)
    elif a.task == "all":
        ap.error("--task all: ablation only; ratchet takes one task")
    else:
        ratchet(TASKS[a.task or "long_mlp"](), a.steps)


if __name__ == "__main__":
    main()
