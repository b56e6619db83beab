"""quantrs' own safetensors layout for packed weights: what ``quantrs quantize --format
int4`` and ``quantrs convert`` write, and reading it back (docs/cli.md,
docs/checkpoints.md).

Each shard's metadata holds ``quantrs.format`` (the file's format), ``quantrs.version``
and ``quantrs.tensors``, a JSON object giving, per weight name ``n``, its ``format`` and
sizes; the packed parts are tensors named ``n.<part>``:

- ``int4`` (``QuantizedWeight``): ``n.qweight`` U8 ``[num_pairs, out]``, ``n.scales`` F32
  ``[num_groups, out]``.
"""

from __future__ import annotations

import json

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, TensorNotFoundError

FORMAT_KEY = "quantrs.format"
TENSORS_KEY = "quantrs.tensors"
FORMAT_VERSION = "1"


def own_entry(ck: Checkpoint, name: str) -> dict | None:
    """The ``quantrs.tensors`` entry of packed weight ``name`` (None when ``name`` is not
    a packed weight of this layout)."""
    first = next((n for n in (name + ".qweight", name + ".codes") if n in ck), None)
    if first is None:
        return None
    try:
        table = json.loads(ck.reader(first).metadata.get(TENSORS_KEY, "{}"))
    except ValueError as e:
        raise CorruptCheckpointError(f"{ck.path}: metadata {TENSORS_KEY!r}: {e}") from None
    entry = table.get(name) if isinstance(table, dict) else None
    return entry if isinstance(entry, dict) else None


def read_own(ck: Checkpoint, name: str):
    """The packed weight ``name`` of an open checkpoint in this layout: a
    ``QuantizedWeight`` ``[in, out]`` for ``int4``."""
    from .. import QuantError, QuantizedWeight

    entry = own_entry(ck, name)
    if entry is None or entry.get("format") != "int4":
        raise TensorNotFoundError(f"{ck.path} holds no quantrs INT4 tensor {name!r}")
    try:
        data = ck.array(name + ".qweight", ("U8",)).reshape(-1)
        scales = ck.array(name + ".scales", ("F32",)).reshape(-1)
        return QuantizedWeight(
            data, scales, int(entry["in_feat"]), int(entry["out_feat"]), int(entry["num_groups"])
        )
    except (KeyError, TypeError, ValueError, QuantError) as e:
        raise CorruptCheckpointError(f"{ck.path}: quantrs INT4 tensor {name!r}: {e}") from None
