"""``quantrs inspect FILE``: list a safetensors file's tensors and how each is quantized.

Reads only the header (and the 4-byte FP8 scales), never the tensor data.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ._errors import CliError
from ._layout import FORMAT_KEY, TENSORS_KEY
from ._stfile import StFormatError, StReader
from ._table import table


def inspect_file(path: str | os.PathLike) -> dict:
    """``{"path", "metadata", "tensors": [{name, dtype, shape, bytes, kind}], ...}``."""
    try:
        reader = StReader(path)
    except StFormatError as e:
        raise CliError(f"{path}: not a valid safetensors file: {e}") from None
    with reader:
        try:
            qmeta = json.loads(reader.metadata.get(TENSORS_KEY, "{}"))
        except (ValueError, RecursionError):  # a deeply nested header is as bad as any
            qmeta = {}
        if not isinstance(qmeta, dict):
            qmeta = {}
        kinds = _kinds(reader, qmeta)
        tensors = [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "kind": kinds.get(t.name, "-"),
            }
            for t in reader.in_file_order()
        ]
        meta = {k: v for k, v in reader.metadata.items() if k != TENSORS_KEY}
    return {
        "path": str(path),
        "file_bytes": os.path.getsize(path),
        "quantrs_format": reader.metadata.get(FORMAT_KEY),
        "metadata": meta,
        "tensors": tensors,
    }


def _kinds(reader: StReader, qmeta: dict) -> dict[str, str]:
    kinds: dict[str, str] = {}
    meta = reader.metadata
    if meta.get("format") == "quantrs.int4":  # one QuantizedWeight.save() file
        what = f"int4 QuantizedWeight [{meta.get('in_feat')}x{meta.get('out_feat')}]"
        what += f", group {meta.get('group_size')}"
        kinds.update({"data": f"{what}: packed codes", "scales": f"{what}: scales"})
    for name, m in qmeta.items():
        if isinstance(m, dict) and m.get("format") == "int4":
            what = f"int4 of {name} [{m.get('out_feat')}x{m.get('in_feat')}]"
            what += f", group {m.get('group_size')}"
            kinds[name + ".qweight"] = f"{what}: packed codes"
            kinds[name + ".scales"] = f"{what}: scales"
    for t in reader.tensors:
        if t.dtype not in ("F8_E4M3", "F8_E5M2"):
            continue
        fmt = t.dtype[3:].lower()
        scale = reader.by_name.get(t.name + "_scale_inv")
        if scale is not None and scale.dtype == "F32" and scale.nbytes == 4:
            value = float(np.array(reader.array(scale)).reshape(-1)[0])
            kinds[t.name] = f"fp8 {fmt}, per-tensor scale {value:.4g}"
            kinds[scale.name] = f"fp8 scale of {t.name}"
        elif scale is not None:
            kinds[t.name] = f"fp8 {fmt}, block scales"
            kinds[scale.name] = f"fp8 scales of {t.name}"
        else:
            kinds[t.name] = f"fp8 {fmt}, no scale"
    return kinds


def format_inspect(info: dict) -> str:
    rows = [
        [t["name"], t["dtype"], "x".join(map(str, t["shape"])) or "scalar", t["bytes"], t["kind"]]
        for t in info["tensors"]
    ]
    out = [table(["tensor", "dtype", "shape", "bytes", "quantization"], rows)]
    n_q = sum(t["kind"] != "-" for t in info["tensors"])
    tb = sum(t["bytes"] for t in info["tensors"])
    fmt = info["quantrs_format"] or info["metadata"].get("format") or "not quantrs"
    out.append(
        f"{len(rows)} tensors ({n_q} quantized), {tb:,} tensor bytes, "
        f"{info['file_bytes']:,} file bytes; format: {fmt}"
    )
    extra = {k: v for k, v in info["metadata"].items() if not k.startswith("quantrs.")}
    if extra:
        shown = ", ".join(f"{k}={v[:40]!r}" for k, v in sorted(extra.items()))
        out.append(f"metadata: {shown}")
    return "\n".join(out)
