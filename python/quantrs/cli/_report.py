"""Output of ``quantrs demo``: the table, JSON, and the loss-curve PNG."""

from __future__ import annotations

import dataclasses
import io
import json

from .._core import _atomic_write
from ._table import table


def _cells(r) -> list[object]:
    if r.note:
        return [r.method, r.note, "", "", "", ""]
    return [
        r.method,
        f"{r.loss:.4f}",
        f"{r.accuracy:.2f}",
        "-" if r.state_bytes is None else r.state_bytes,
        r.model_bytes,
        f"{r.seconds:.3f}",
    ]


def demo_table(settings: dict, rows) -> str:
    head = ["method", "final loss", "test acc %", "optimizer-state bytes", "model bytes", "time s"]
    body = [_cells(r) for r in rows]
    lines = [
        f"quantrs demo: 8x8 digits ({settings['train']} train / {settings['test']} test), "
        f"MLP 64-{settings['hidden']}-10, {settings['epochs']} epochs of batch "
        f"{settings['batch']}, lr {settings['lr']}, weight decay {settings['weight_decay']}, "
        f"seed {settings['seed']}",
        table(head, body),
        "final loss: mean cross-entropy on the training set, weights as served "
        "(QAT: the quantized view).\n"
        "state bytes: the optimizers' live buffers (QAT: m, v and the quantized view at the "
        "master's precision, plus the float32 bias state).\n"
        "model bytes: weights and biases as deployed (QAT: the quantized weights packed, "
        "1 byte per int8/fp8 weight, half a byte per int4 weight, plus a float32 scale).",
    ]
    return "\n".join(lines)


def demo_json(settings: dict, rows) -> str:
    return json.dumps(
        {"settings": settings, "rows": [dataclasses.asdict(r) for r in rows]}, indent=1
    )


def write_plot(rows, path: str) -> None:
    """Write the per-epoch training loss of every trained method as a PNG, atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for r in rows:
        if r.curve:
            ax.plot(range(1, len(r.curve) + 1), r.curve, label=r.method)
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss (cross-entropy)")
    ax.set_yscale("log")
    ax.set_title("quantrs demo: MLP on the 8x8 digits")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png")
    finally:
        plt.close(fig)
    _atomic_write(path, png.getvalue())
