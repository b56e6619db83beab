"""The files ``quantrs quantize`` writes: metadata keys, the INT4 layout, reading back.

See the module doc of :mod:`._quantize` and docs/cli.md for the full layout.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..formats._int4 import int4_layout
from ..formats._stfile import OutSpec
from ..formats.own_layout import FORMAT_KEY, FORMAT_VERSION, TENSORS_KEY, read_own
from ._errors import CliError

__all__ = [
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "TENSORS_KEY",
    "check_unique_outputs",
    "int4_layout",
    "int4_outputs",
    "load_int4",
]


def check_unique_outputs(sources: Iterable[tuple[str, list[OutSpec]]], hint: str = "") -> None:
    """Refuse two output tensors of one name; ``sources``: ``(input name, its outputs)``."""
    seen: dict[str, str] = {}
    for src, outs in sources:
        for o in outs:
            if o.name in seen:
                raise CliError(
                    f"output name {o.name!r} (from {src!r}) clashes with {seen[o.name]!r}{hint}"
                )
            seen[o.name] = src


def int4_outputs(
    name: str, in_feat: int, out_feat: int, group_size: int, src_dtype: str
) -> tuple[list[OutSpec], dict]:
    """The two tensors (``<name>.qweight`` U8, ``<name>.scales`` F32) and the metadata
    entry of an INT4 weight ``[in_feat, out_feat]`` converted from ``src_dtype``."""
    gs, pairs, groups = int4_layout(in_feat, group_size)
    outs = [
        OutSpec(name + ".qweight", "U8", (pairs, out_feat)),
        OutSpec(name + ".scales", "F32", (groups, out_feat)),
    ]
    meta = {
        "format": "int4",
        "in_feat": in_feat,
        "out_feat": out_feat,
        "group_size": gs,
        "num_groups": groups,
        "dtype": src_dtype,
    }
    return outs, meta


def load_int4(path: str | os.PathLike, name: str):
    """Rebuild the ``QuantizedWeight`` that ``quantize --format int4`` (or ``convert``)
    wrote for tensor ``name`` (its ``matmul(x)`` computes ``x @ W.T`` for the original
    ``W``). ``path``: the output file, or the output model folder (any shard)."""
    from ..formats import Checkpoint

    with Checkpoint(path) as ck:
        return read_own(ck, name)
