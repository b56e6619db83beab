"""``quantrs inspect PATH``: list the tensors of a safetensors file or model folder and
how each is quantized, naming the dialect of every FP8 tensor (docs/checkpoints.md).

Reads only the headers (and the one-value FP8 scales), never the tensor data.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..formats import Checkpoint, FormatError
from ..formats._stfile import StFormatError, StReader
from ..formats.awq import awq_geometry
from ..formats.fp8 import classify
from ..formats.gptq import gptq_geometry, gptq_layers
from ._errors import CliError
from ._inspect_gguf import inspect_gguf, is_gguf
from ._layout import FORMAT_KEY, TENSORS_KEY
from ._table import table


def inspect_path(path: str | os.PathLike) -> dict:
    """:func:`inspect_file` for a file; for a model folder, every shard's tensors (each
    row with its ``file``), the folder's ``quantization_config`` and FP8 dialects
    resolved across shards."""
    if not os.path.isdir(path):
        return inspect_gguf(path) if is_gguf(path) else inspect_file(path)
    try:
        ck = Checkpoint(path)
    except FormatError as e:
        raise CliError(str(e)) from None
    with ck:
        qcfg = ck.quant_settings()
        kinds: dict[str, str] = {}
        for r in ck.readers.values():
            kinds.update(_kinds(r, _qmeta(r)))
        kinds.update(_fp8_kinds(ck, str(qcfg.get("quant_method", "")) or None))
        kinds.update(_zero_point_kinds(ck, qcfg))
        tensors = []
        for shard, r in ck.readers.items():
            for t in r.in_file_order():
                row = _row(t, kinds)
                row["file"] = shard.name
                tensors.append(row)
        first = next(iter(ck.readers.values()))
        meta = {k: v for k, v in first.metadata.items() if k != TENSORS_KEY}
        fmt = first.metadata.get(FORMAT_KEY)
    return {
        "path": str(path),
        "file_bytes": sum(os.path.getsize(s) for s in ck.shards),
        "files": [s.name for s in ck.shards],
        "quantrs_format": fmt,
        "quantization_config": qcfg or None,
        "metadata": meta,
        "tensors": tensors,
    }


def _qmeta(reader: StReader) -> dict:
    try:
        qmeta = json.loads(reader.metadata.get(TENSORS_KEY, "{}"))
    except (ValueError, RecursionError):  # a deeply nested header is as bad as any
        qmeta = {}
    return qmeta if isinstance(qmeta, dict) else {}


def _row(t, kinds: dict) -> dict:
    return {
        "name": t.name,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "bytes": t.nbytes,
        "kind": kinds.get(t.name, "-"),
    }


def inspect_file(path: str | os.PathLike) -> dict:
    """``{"path", "metadata", "tensors": [{name, dtype, shape, bytes, kind}], ...}``."""
    try:
        reader = StReader(path)
    except StFormatError as e:
        raise CliError(f"{path}: not a valid safetensors file: {e}") from None
    with reader:
        kinds = _kinds(reader, _qmeta(reader))
        kinds.update(_fp8_kinds(reader, None))
        tensors = [_row(t, kinds) for t in reader.in_file_order()]
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
        if not isinstance(m, dict) or m.get("format") not in _OWN_PARTS:
            continue
        fmt = m["format"] if m["format"] != "gguf" else f"gguf {m.get('type')}"
        what = f"{fmt} of {name} [{m.get('out_feat')}x{m.get('in_feat')}]"
        if "group_size" in m:
            what += f", group {m.get('group_size')}"
        if "bits" in m:
            what += f", {m.get('bits')}-bit"
        for part, role in _OWN_PARTS[m["format"]].items():
            kinds[f"{name}.{part}"] = f"{what}: {role}"
    return kinds


# the tensors of each packed format of quantrs' layout (formats.own_layout)
_OWN_PARTS = {
    "int4": {"qweight": "packed codes", "scales": "scales"},
    "int4_asym": {"codes": "packed codes", "scales": "step and minimum"},
    "int4_k": {"codes": "packed codes", "scale_codes": "6-bit step and minimum codes",
               "supers": "super-block scales"},
    "int_zp": {"codes": "codes", "scales": "scales", "zeros": "zero points",
               "perm": "input order"},
    "gguf": {"blocks": "ggml blocks"},
}  # fmt: skip


def _zero_point_kinds(ck: Checkpoint, qcfg: dict) -> dict[str, str]:
    """Kinds of the GPTQ / AWQ layers' tensors, from the config and the headers: the
    method, bits, group size and what quantrs loads them into."""
    method = str(qcfg.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        return {}
    kinds: dict[str, str] = {}
    for p in gptq_layers(ck):  # the same '<layer>.qweight' rule for both
        try:
            geo = gptq_geometry(ck, p) if method == "gptq" else awq_geometry(ck, p)
        except FormatError as e:
            kinds[p + ".qweight"] = f"{method}: unreadable ({e})"
            continue
        bits = geo.get("bits", 4)
        what = f"{method} {bits}-bit, group {geo['group_size']}"
        if method == "gptq":
            what += f", v{geo['version']}"
        what += " (exact: int4 if symmetric in order, else int_zp)"
        for k in ("qweight", "qzeros", "scales", "g_idx"):
            if f"{p}.{k}" in ck:
                kinds[f"{p}.{k}"] = f"{what}: {k}"
    return kinds


def _fp8_kinds(src, quant_method: str | None) -> dict[str, str]:
    """Kinds of every FP8 tensor of ``src`` (a :class:`StReader` or a
    :class:`Checkpoint`) and of its scales, naming the dialect."""
    if isinstance(src, StReader):
        names = src.by_name

        def info(n):
            return names.get(n)

        def reader(n):
            return src
    else:
        names = set(src.names())

        def info(n):
            return src.info(n) if n in src else None

        reader = src.reader
    kinds: dict[str, str] = {}
    for n in list(names):
        t = info(n)
        if t.dtype not in ("F8_E4M3", "F8_E5M2"):
            continue
        fmt = t.dtype[3:].lower()
        layer = classify(n, info, quant_method)
        d = layer.dialect
        if layer.scale is None:
            kinds[n] = f"fp8 {fmt}, no scale"
            continue
        st = info(layer.scale)
        if d in ("compressed-tensors", "fp8", "mistralrs") and st.dtype in ("F32", "F16", "BF16"):
            a = np.array(reader(st.name).array(st)).reshape(-1)
            value = float(a.view(np.float32)[0] if st.dtype == "F32" else _half(a, st.dtype))
            kinds[n] = f"fp8 {fmt}, per-tensor scale {value:.4g} ({d})"
            kinds[st.name] = f"fp8 scale of {n}"
        else:
            kinds[n] = f"fp8 {fmt}, {d} scales"
            kinds[st.name] = f"fp8 scales of {n}"
        if layer.act_scale:
            kinds[layer.act_scale] = f"fp8 activation scale of {n}"
    return kinds


def _half(a: np.ndarray, dtype: str) -> float:
    if dtype == "BF16":
        return float((a.astype(np.uint32) << 16).view(np.float32)[0])
    return float(a.view(np.float16)[0])


def format_inspect(info: dict) -> str:
    rows = [
        [t["name"], t["dtype"], "x".join(map(str, t["shape"])) or "scalar", t["bytes"], t["kind"]]
        for t in info["tensors"]
    ]
    out = [table(["tensor", "dtype", "shape", "bytes", "quantization"], rows)]
    n_q = sum(t["kind"] != "-" for t in info["tensors"])
    tb = sum(t["bytes"] for t in info["tensors"])
    qcfg = info.get("quantization_config") or {}
    fmt = (
        info["quantrs_format"]
        or info["metadata"].get("format")
        or qcfg.get("quant_method")
        or "not quantrs"
    )
    out.append(
        f"{len(rows)} tensors ({n_q} quantized), {tb:,} tensor bytes, "
        f"{info['file_bytes']:,} file bytes; format: {fmt}"
    )
    if info.get("files"):
        out.append(f"files: {', '.join(info['files'])}")
    extra = {k: v for k, v in info["metadata"].items() if not k.startswith("quantrs.")}
    if extra:
        shown = ", ".join(f"{k}={v[:40]!r}" for k, v in sorted(extra.items()))
        out.append(f"metadata: {shown}")
    return "\n".join(out)
