"""``quantrs quantize`` on a Hugging Face model folder.

IN holds ``model.safetensors`` or ``model.safetensors.index.json`` plus shards (validated
first by :class:`quantrs.formats.Checkpoint`: every shard present, the index and the
shards agreeing). Each shard is quantized by :func:`._quantize.quantize_file`, one at a
time, so the peak memory stays about one tensor. OUT gets the quantized shards (same
file names), a new index (``weight_map`` over the output tensor names, ``total_size``),
every other file and folder of IN copied, and ``config.json`` with a
``quantization_config`` describing what was done (docs/checkpoints.md).

Atomic: everything is written to a temporary sibling folder of OUT, renamed to OUT at the
end; an existing OUT is replaced only then (moved aside, the new folder renamed in, the
old one deleted), so on any failure it is untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..formats import Checkpoint, FormatError
from ..formats._checkpoint import INDEX_NAME
from ..formats._ggml_types import QUANTIZE_TYPES
from ..formats.fp8 import quantization_config as fp8_config
from ._errors import CliError
from ._quantize import check_options, quantize_file
from ._select import Selector


def _ignored_modules(rows: list[dict]) -> list[str]:
    """Modules whose 2-D float ``.weight`` stayed unquantized, and ``lm_head`` (kept
    float, present or tied), as llm-compressor lists them in ``ignore``."""
    out = []
    for r in rows:
        n = r["name"]
        if r["kind"] == "copy" and n.endswith(".weight") and len(r["shape"]) == 2:
            if r["dtype"] in ("F16", "BF16", "F32", "F64"):
                out.append(n[: -len(".weight")])
    if "lm_head" not in out and not any(
        r["name"] == "lm_head.weight" and r["kind"] != "copy" for r in rows
    ):
        out.append("lm_head")
    return out


def quantization_config(
    fmt: str, layout: str, group_size: int, rows, selector, method: str = "rtn"
) -> dict:
    ignore = _ignored_modules(rows)
    if fmt == "fp8":
        return fp8_config(layout, ignore)
    if fmt in QUANTIZE_TYPES:  # per-tensor ggml types (fallbacks): the entries say which
        return {
            "quant_method": "quantrs",
            "format": fmt,
            "layout": "quantrs.packed",
            "layout_version": 1,
            "method": method,
            "modules_not_converted": ignore,
            "selection": selector.describe(),
            "producer": "quantrs",
        }
    cfg = {
        "quant_method": "quantrs",
        "format": fmt,
        "bits": 4,
        "group_size": group_size,
        "symmetric": fmt == "int4",
        "layout": f"quantrs.{fmt}",
        "layout_version": 1,
        "modules_not_converted": ignore,
        "selection": selector.describe(),
        "producer": "quantrs",
    }
    if method != "rtn" or fmt != "int4":  # "rtn" int4 configs stay as they always were
        cfg["method"] = method
    return cfg


def _copy_other(src: Path, dst: Path, skip: set[str]) -> list[str]:
    copied = []
    for entry in sorted(src.iterdir()):
        if entry.name in skip or entry.name == "config.json":
            continue
        if entry.is_dir():
            shutil.copytree(entry, dst / entry.name, symlinks=False)
        else:
            shutil.copy2(entry, dst / entry.name)
        copied.append(entry.name)
    return copied


def quantize_folder(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    fmt: str,
    group_size: int = 32,
    progress: bool = True,
    layout: str = "compressed-tensors",
    selector: Selector | None = None,
    method: str | None = None,
    calibration: str | None = None,
    windows: int = 8,
    length: int = 512,
) -> tuple[list[dict], dict]:
    """Quantize model folder ``src`` into folder ``dst``; ``(rows, summary)``.
    ``calibration``: a text file run through the model first (:mod:`._calibration`)."""
    method = check_options(fmt, group_size, layout, method)
    if method == "gptq" and calibration is None:
        raise CliError("--method gptq needs --calibration TEXT")
    selector = selector or Selector()
    src, dst = Path(src), Path(dst)
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise CliError("OUT must be outside IN")
    if dst.exists() and not dst.is_dir():
        raise CliError(f"IN is a model folder, so OUT must be a folder; {str(dst)!r} is a file")
    if not dst.parent.is_dir():
        raise CliError(f"output directory {str(dst.parent)!r} does not exist")
    try:
        with Checkpoint(src) as ck:  # validates the index and every shard header
            shards, has_index, config = ck.shards, ck.is_folder and bool(ck.index), ck.config
    except FormatError as e:
        raise CliError(str(e)) from None
    if "quantization_config" in config:
        method = config["quantization_config"].get("quant_method", "?")
        raise CliError(f"{src / 'config.json'}: the model is already quantized ({method})")

    prepared = None
    if calibration is not None:
        from ._calibration import prepare

        prepared = prepare(
            str(src), calibration, fmt, group_size, method, selector, windows, length
        )
    tmp = staging_folder(dst)
    try:
        rows, weight_map = [], {}
        for shard in shards:
            shard_rows = quantize_file(
                shard,
                tmp / shard.name,
                fmt,
                group_size,
                progress,
                layout,
                selector,
                method,
                prepared,
            )
            for r in shard_rows:
                r["shard"] = shard.name
                weight_map.update(dict.fromkeys(r["outputs"], shard.name))
            rows += shard_rows
        total = sum(r["bytes_out"] for r in rows)
        if has_index:
            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        copied = _copy_other(src, tmp, {s.name for s in shards} | {INDEX_NAME})
        qcfg = quantization_config(fmt, layout, group_size, rows, selector, method)
        if calibration is not None:
            qcfg["calibration"] = {"windows": windows, "length": length}
        if (src / "config.json").is_file():
            config["quantization_config"] = qcfg
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            copied.append("config.json (with quantization_config)")
        _install(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary = {
        "input": str(src),
        "output": str(dst),
        "shards": [s.name for s in shards],
        "files_copied": copied,
        "quantization_config": qcfg,
        "total_size": total,
    }
    return rows, summary


def staging_folder(dst: Path) -> Path:
    """A new folder beside ``dst`` to write into before it is renamed to ``dst``, with the
    permissions an ordinary ``mkdir`` would give under the process's umask: ``mkdtemp``
    makes it private (0700), which would carry over to the installed model folder."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def _install(tmp: Path, dst: Path) -> None:
    """Rename the finished ``tmp`` to ``dst``; an existing ``dst`` is replaced only once
    the new folder is in place."""
    if not dst.exists():
        os.replace(tmp, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
    os.replace(dst, old / "x")
    try:
        os.replace(tmp, dst)
    except BaseException:
        os.replace(old / "x", dst)
        raise
    shutil.rmtree(old, ignore_errors=True)
