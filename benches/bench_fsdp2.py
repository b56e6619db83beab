"""The cost of the DTensor path of quantrs.torch.AdamW4bit under FSDP2 (docs/torch.md,
"Scaling out"), on the CPU with gloo.

Each of ``--world`` processes holds a GPT-2-shaped model (``--blocks`` blocks of Linear
768x2304 / 768x768 / 768x3072 / 3072x768 with biases and two LayerNorms; ``--embeddings``
adds GPT-2's token and position tables, 50257x768 and 1024x768: with 12 blocks that is
GPT-2 small, 124 M parameters) under ``fully_shard``, and plain tensors with exactly the
shapes of that rank's local shards. Both get gradients once; then ``AdamW4bit.step()``
runs on each in turn (alternating which goes first), and the median step times are
compared: the DTensor step (the sharded row layout: scales double-quantized per row, the
placement checks, ``to_local``, the float32 moments of the 1-D parameters) against the
plain-tensor step with its defaults (the flat layout, docs/torch.md), with the state
bytes per local parameter of each, measured from the engines' live buffers.

Run: python benches/bench_fsdp2.py [--world 2] [--blocks 2] [--embeddings] [--reps 15]
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


def _blocks(n, embeddings):
    layers = []
    if embeddings:
        layers += [torch.nn.Embedding(50257, 768), torch.nn.Embedding(1024, 768)]
    for _ in range(n):
        layers += [
            torch.nn.LayerNorm(768),
            torch.nn.Linear(768, 2304),
            torch.nn.Linear(768, 768),
            torch.nn.LayerNorm(768),
            torch.nn.Linear(768, 3072),
            torch.nn.Linear(3072, 768),
        ]
    return torch.nn.Sequential(*layers)


def _worker(rank, world, port, blocks, embeddings, reps, out):
    from torch.distributed.fsdp import fully_shard

    import quantrs.torch as qt

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=1200))
    torch.manual_seed(0)
    sharded = _blocks(blocks, embeddings)
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
    opts = {
        "dtensor": qt.AdamW4bit(sharded.parameters(), lr=1e-4),
        "plain": qt.AdamW4bit(plain, lr=1e-4),
    }
    for opt in opts.values():
        opt.step()
    times = {k: [] for k in opts}
    cpu = {k: [] for k in opts}
    for r in range(reps):
        order = list(opts.items())
        for name, opt in order[r % 2 :] + order[: r % 2]:  # each first in turn
            c0, t0 = time.thread_time(), time.perf_counter()
            opt.step()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
    med = {k: statistics.median(v) for k, v in times.items()}
    # The calling thread's CPU time: the Python side of the step (checks, views, the
    # 1-D parameters' torch step) while the 4-bit kernels run on the pool's threads. Far
    # less sensitive to other load than the wall time.
    med.update({"cpu_" + k: statistics.median(v) for k, v in cpu.items()})
    numel = sum(q.numel() for q in plain)
    bpp = {k: o.state_bytes() / numel for k, o in opts.items()}
    out.put((rank, numel, med, bpp))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--embeddings", action="store_true")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, a.world, port, a.blocks, a.embeddings, a.reps, out))
        for r in range(a.world)
    ]
    for p in procs:
        p.start()
    rows = sorted((out.get(timeout=1200) for _ in procs), key=lambda r: r[0])
    for p in procs:
        p.join()
    print(
        f"world {a.world}, {a.blocks} blocks{' + embeddings' if a.embeddings else ''}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| rank | local params | plain ms | DTensor ms | overhead | "
        "caller CPU plain / DTensor ms | state B/param plain / DTensor |"
    )
    print("|---|---|---|---|---|---|---|")
    for rank, numel, med, bpp in rows:
        tp, td = med["plain"], med["dtensor"]
        print(
            f"| {rank} | {numel:,} | {tp * 1e3:.1f} | {td * 1e3:.1f} | "
            f"{(td / tp - 1) * 100:+.1f} % | {med['cpu_plain'] * 1e3:.1f} / "
            f"{med['cpu_dtensor'] * 1e3:.1f} | {bpp['plain']:.4f} / {bpp['dtensor']:.4f} |"
        )


if __name__ == "__main__":
    main()
