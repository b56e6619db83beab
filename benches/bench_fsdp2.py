"""The cost of the DTensor path of quantrs.torch.AdamW4bit under FSDP2 (docs/torch.md,
"Scaling out"), on the CPU with gloo.

Each of ``--world`` processes holds a GPT-2-block-shaped model (``--blocks`` blocks of
Linear 768x2304 / 768x768 / 768x3072 / 3072x768 with biases) under ``fully_shard``, and a
plain model whose tensors have exactly the shapes of that rank's local shards. Both get
gradients once; then ``AdamW4bit.step()`` runs on each, alternating, and the median step
times are compared: the difference is what the DTensor path adds (placement checks,
``to_local``), the 4-bit work being the same.

Run: python benches/bench_fsdp2.py [--world 2] [--blocks 2] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _blocks(n):
    layers = []
    for _ in range(n):
        layers += [
            torch.nn.Linear(768, 2304),
            torch.nn.Linear(768, 768),
            torch.nn.Linear(768, 3072),
            torch.nn.Linear(3072, 768),
        ]
    return torch.nn.Sequential(*layers)  # fully_shard needs a forward


def _worker(rank, world, port, blocks, reps, out):
    from torch.distributed.fsdp import fully_shard

    import quantrs.torch as qt

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    torch.manual_seed(0)
    sharded = _blocks(blocks)
    for m in sharded:
        fully_shard(m)
    fully_shard(sharded)
    plain = [torch.nn.Parameter(p.to_local().detach().clone()) for p in sharded.parameters()]
    for p, q in zip(sharded.parameters(), plain):
        g = torch.randn(q.shape)
        q.grad = g
        p.grad = torch.distributed.tensor.DTensor.from_local(
            g.clone(), p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
        )
    opt_d = qt.AdamW4bit(sharded.parameters(), lr=1e-4)
    opt_p = qt.AdamW4bit(plain, lr=1e-4)
    opt_d.step()
    opt_p.step()
    times = {"dtensor": [], "plain": []}
    for _ in range(reps):
        for name, opt in (("plain", opt_p), ("dtensor", opt_d)):
            t0 = time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    numel = sum(q.numel() for q in plain)
    out.put((rank, numel, med["plain"], med["dtensor"], opt_d.state_bytes() / numel))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, a.world, port, a.blocks, a.reps, out))
        for r in range(a.world)
    ]
    for p in procs:
        p.start()
    rows = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    print(f"world {a.world}, {a.blocks} blocks, load average {os.getloadavg()[0]:.1f}")
    print("| rank | local params | plain step ms | DTensor step ms | overhead | state B/param |")
    print("|---|---|---|---|---|---|")
    for rank, numel, tp, td, bpp in rows:
        print(
            f"| {rank} | {numel:,} | {tp * 1e3:.1f} | {td * 1e3:.1f} | "
            f"{(td / tp - 1) * 100:+.1f} % | {bpp:.4f} |"
        )


if __name__ == "__main__":
    main()
