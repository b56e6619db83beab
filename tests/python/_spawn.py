"""Run a test's worker in ``world`` processes on 127.0.0.1 and collect what each rank
saved: the pattern of the torch.distributed tests (a bounded run, findings on disk)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker, world: int, outdir: str, timeout_s: float, *extra) -> list:
    """Spawn ``worker(rank, port, outdir, *extra)`` on ``world`` ranks; each saves its
    findings to ``outdir/rank<r>.pt``, returned in rank order. Fails the test when the
    run takes longer than ``timeout_s`` or a rank dies."""
    ctx = mp.start_processes(
        worker, args=(_free_port(), outdir, *extra), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world}-process run took more than {timeout_s} s")
    except mp.ProcessExitedException as e:
        written = sorted(f for f in os.listdir(outdir) if f.startswith("rank"))
        raise AssertionError(f"{e}; findings written by then: {written}") from e
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return [torch.load(os.path.join(outdir, f"rank{r}.pt")) for r in range(world)]
