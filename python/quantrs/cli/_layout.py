"""The files ``quantrs quantize`` writes: metadata keys, the INT4 layout, reading back.

See the module doc of :mod:`._quantize` and docs/cli.md for the full layout.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ._stfile import StReader

FORMAT_KEY = "quantrs.format"
TENSORS_KEY = "quantrs.tensors"
FORMAT_VERSION = "1"


def int4_layout(in_feat: int, group_size: int) -> tuple[int, int, int]:
    """``(effective group size, num_pairs, num_groups)`` of ``QuantizedWeight`` (docs/int4.md)."""
    gs = min(group_size, in_feat + in_feat % 2)
    in_padded = -(-in_feat // gs) * gs
    return gs, in_padded // 2, in_padded // gs


def load_int4(path: str | os.PathLike, name: str):
    """Rebuild the ``QuantizedWeight`` that ``quantize --format int4`` wrote for
    tensor ``name`` (its ``matmul(x)`` computes ``x @ W.T`` for the original ``W``)."""
    from .. import QuantizedWeight

    with StReader(path) as r:
        meta = json.loads(r.metadata.get(TENSORS_KEY, "{}")).get(name)
        if meta is None or meta.get("format") != "int4":
            raise KeyError(f"{path} holds no quantrs INT4 tensor {name!r}")
        data = np.array(r.array(r.by_name[name + ".qweight"])).reshape(-1)
        scales = np.array(r.array(r.by_name[name + ".scales"])).reshape(-1)
    return QuantizedWeight(data, scales, meta["in_feat"], meta["out_feat"], meta["num_groups"])
