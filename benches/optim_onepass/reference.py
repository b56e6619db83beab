"""The two steps `estimate.rs` is read against, measured the same way: the extension's
state-format-2 step (the NumPy API, `AdamW4bit.update` + `step`) and torch's fused AdamW,
one 2^LOG2N float32 parameter, alternating in one process; process CPU time per element
(median and best over the rounds) and wall time (docs/optim.md, "A one-pass state layout:
the estimate").

Run: python benches/optim_onepass/reference.py [--threads 1] [--log2n 18 24] [--rounds 12]
(--threads sets RAYON_NUM_THREADS and torch.set_num_threads before either starts a pool.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log2n", type=int, nargs="+", default=[18, 24])
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args(argv)
    if a.threads < 1 or a.rounds < 1 or any(not 10 <= k <= 28 for k in a.log2n):
        ap.error("--threads and --rounds: expected >= 1; --log2n: expected 10..28")
    os.environ["RAYON_NUM_THREADS"] = str(a.threads)
    import numpy as np
    import torch

    import quantrs

    torch.set_num_threads(a.threads)
    print(f"threads {a.threads}; CPU ns per element (best / median), wall ms (min / median)")
    for log2n in a.log2n:
        n = 1 << log2n
        rng = np.random.default_rng(0)
        w = rng.standard_normal(n).astype(np.float32)
        g = (rng.standard_normal(n) * 1e-2).astype(np.float32)
        opt = quantrs.AdamW4bit(1e-3, 0.9, 0.999, 1e-8, 0.01)

        def format2(opt=opt, w=w, g=g):
            opt.update(w, g)
            opt.step()

        pw = torch.nn.Parameter(torch.from_numpy(w.copy()))
        pw.grad = torch.from_numpy(g.copy())
        fused = torch.optim.AdamW([pw], lr=1e-3, weight_decay=0.01, fused=True)
        steps = {"format2 (NumPy API)": format2, "torch fused AdamW": fused.step}
        for step in steps.values():
            step()
        cpu = {k: [] for k in steps}
        wall = {k: [] for k in steps}
        rounds = a.rounds if log2n > 20 else 16 * a.rounds
        for _ in range(rounds):
            for name, step in steps.items():
                c0, t0 = time.process_time(), time.perf_counter()
                step()
                wall[name].append((time.perf_counter() - t0) * 1e3)
                cpu[name].append((time.process_time() - c0) * 1e9 / n)
        for name in steps:
            c, t = cpu[name], wall[name]
            print(
                f"2^{log2n} {name:20} CPU {min(c):.3f} / {statistics.median(c):.3f} ns, "
                f"wall {min(t):.2f} / {statistics.median(t):.2f} ms ({rounds} rounds)"
            )


if __name__ == "__main__":
    main()
