"""``quantrs quantize IN OUT --format int4|int4_asym|int4_k|fp8|q4_0|...|q6_k``: quantize one
safetensors file (a model folder goes through :mod:`._folder`, shard by shard, with this
function).

The tensors chosen by :mod:`._select` (by default the 2-D weights of linear layers) are
quantized; everything else is copied byte for byte. 2-D tensors are read in the
PyTorch ``nn.Linear`` convention, ``weight[out_features, in_features]``.

Output layouts (also in docs/cli.md and docs/checkpoints.md):

- ``fp8``: ``<name>`` becomes F8_E4M3 ``[out, in]`` with, for ``--layout
  compressed-tensors`` (the default), ``<name>_scale`` F32 ``[1]`` (so ``x.weight`` gives
  ``x.weight_scale``, what llm-compressor and vLLM use), or for ``--layout mistralrs``
  ``<name>_scale_inv`` a F32 scalar. ``PerTensorFP8Linear.from_safetensors(path, "x")``
  reads both. Codes and scale are exactly those of ``PerTensorFP8Linear.from_float``.
- ``int4``: ``<name>.qweight`` U8 ``[num_pairs, out]`` and ``<name>.scales`` F32
  ``[num_groups, out]``: ``QuantizedWeight.quantize(W.T, group_size)``'s ``data`` and
  ``scales`` (groups run along the input dimension). The metadata key
  ``quantrs.tensors`` (JSON) records ``in_feat``, ``out_feat``, ``group_size`` and
  ``num_groups`` per tensor; :func:`load_int4` rebuilds the ``QuantizedWeight``.
- ``int4_asym`` / ``int4_k``: the parts of :mod:`quantrs.formats.own_layout`.
- ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``q8_0``, ``q4_k``, ``q5_k``, ``q6_k``: the
  ``gguf`` entry of :mod:`quantrs.formats.own_layout` (``<name>.blocks``, the ggml blocks
  that ``GgufWeight.quantize`` writes, bit for bit llama.cpp's ``ggml_quantize_chunk``),
  what ``quantrs convert --from gguf`` writes for the same types. A weight whose input
  width the type's block does not divide gets llama.cpp's fallback type or stays float
  (:mod:`quantrs.formats._ggml_types`); the report names each.

Memory: the input is memory-mapped and processed one tensor at a time; the pages of
a processed tensor are dropped (``madvise``), and the output is streamed to disk.
The peak is about one float32 copy of the largest tensor plus its quantized form.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..formats._ggml_types import QUANTIZE_TYPES, block_of, fallback_note, type_for
from ..formats._stfile import OutSpec, StFormatError, StReader, StWriter, TensorInfo
from ..formats.fp8 import LAYOUTS, scale_name
from ..formats.own_layout import asym_outputs, k_outputs, k_super_block
from ._convert import asym_tensor, fp8_tensor, gguf_tensor, int4_tensor, k_tensor
from ._errors import CliError
from ._layout import FORMAT_KEY, FORMAT_VERSION, TENSORS_KEY, check_unique_outputs, int4_outputs
from ._prepared import Prepared
from ._select import Selector

_CHUNK = 16 << 20  # bytes per streamed chunk of a copied tensor


@dataclass
class Job:
    info: TensorInfo
    kind: str  # "int4" | "int4_asym" | "int4_k" | "fp8" | "gguf" | "copy"
    outs: list[OutSpec]
    meta: dict = field(default_factory=dict)
    reason: str = ""  # why a tensor is copied, or gets another ggml type than asked


def _plan(
    reader: StReader, fmt: str, group_size: int, layout: str, selector: Selector
) -> list[Job]:
    jobs = []
    for t in reader.in_file_order():
        quantize, reason = selector.choose(t)
        out_feat, in_feat = t.shape if quantize else (0, 0)
        used = type_for(fmt, in_feat) if quantize and fmt in QUANTIZE_TYPES else fmt
        if quantize and used is None:  # no ggml block fits: the float weight stays
            quantize, reason = False, fallback_note(fmt, None, in_feat)
        if not quantize:
            jobs.append(Job(t, "copy", [OutSpec(t.name, t.dtype, t.shape)], reason=reason))
        elif fmt in QUANTIZE_TYPES:
            jobs.append(_gguf_job(t, used, fallback_note(fmt, used, in_feat)))
        elif fmt == "fp8":
            sshape = (1,) if layout == "compressed-tensors" else ()
            outs = [
                OutSpec(t.name, "F8_E4M3", t.shape),
                OutSpec(scale_name(t.name, layout), "F32", sshape),
            ]
            meta = {"format": "fp8_e4m3", "dtype": t.dtype, "layout": layout}
            jobs.append(Job(t, "fp8", outs, meta))
        elif fmt == "int4_asym":
            if in_feat % 32:
                raise CliError(
                    f"tensor {t.name!r}: {in_feat} inputs, int4_asym needs a multiple of 32 "
                    "(--exclude it, or use --format int4)"
                )
            outs, meta = asym_outputs(t.name, in_feat, out_feat, group_size, t.dtype)
            jobs.append(Job(t, "int4_asym", outs, meta))
        elif fmt == "int4_k":
            if in_feat % 32:
                raise CliError(
                    f"tensor {t.name!r}: {in_feat} inputs, int4_k needs a multiple of 32 "
                    "(--exclude it, or use --format int4)"
                )
            outs, meta = k_outputs(t.name, in_feat, out_feat, k_super_block(in_feat), t.dtype)
            jobs.append(Job(t, "int4_k", outs, meta))
        else:
            outs, meta = int4_outputs(t.name, in_feat, out_feat, group_size, t.dtype)
            jobs.append(Job(t, "int4", outs, meta))
    check_unique_outputs(
        ((j.info.name, j.outs) for j in jobs), "; the input already holds a tensor of that name"
    )
    return jobs


def _gguf_job(t: TensorInfo, gtype: str, reason: str) -> Job:
    """The job writing ``t`` as ggml type ``gtype``: the ``gguf`` entry and ``.blocks``
    tensor of :func:`quantrs.formats.own_layout.own_outputs`."""
    out_feat, in_feat = t.shape
    n, nbytes = block_of(gtype)
    meta = {"format": "gguf", "in_feat": in_feat, "out_feat": out_feat, "dtype": t.dtype,
            "type": gtype}  # fmt: skip
    outs = [OutSpec(t.name + ".blocks", "U8", (out_feat, in_feat // n * nbytes))]
    return Job(t, "gguf", outs, meta, reason)


# --- the command ---------------------------------------------------------------------


def _copy_chunks(reader: StReader, t: TensorInfo):
    raw = reader.raw(t)
    for b0 in range(0, t.nbytes, _CHUNK):
        yield raw[b0 : b0 + _CHUNK]
        reader.release(t, b0, _CHUNK)


def quantize_file(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    fmt: str,
    group_size: int = 32,
    progress: bool = True,
    layout: str = "compressed-tensors",
    selector: Selector | None = None,
    method: str | None = None,
    prepared: Prepared | None = None,
) -> list[dict]:
    """Quantize the file ``src`` into ``dst`` (atomically); return one report row per
    tensor. ``selector`` (default: linear weights only) picks the tensors; ``method`` is
    the INT4 quantizer (``QuantizedWeight.quantize``'s / ``Int4AsymWeight.quantize``'s /
    ``Int4KWeight.quantize``'s, docs/int4.md "Quantizers"; default ``search``); ``prepared``: what
    calibration text gave (importance per tensor, or GPTQ's packed weights)."""
    method = check_options(fmt, group_size, layout, method)
    prepared = prepared or Prepared()
    selector = selector or Selector()
    src, dst = Path(src), Path(dst)
    check_out_file(src, dst)
    try:
        reader = StReader(src)
    except StFormatError as e:
        raise CliError(f"{src}: not a valid safetensors file: {e}") from None
    with reader:
        if FORMAT_KEY in reader.metadata:
            raise CliError(f"{src} is already quantized by quantrs ({reader.metadata[FORMAT_KEY]})")
        jobs = _plan(reader, fmt, group_size, layout, selector)
        metadata = dict(reader.metadata)
        metadata[FORMAT_KEY] = fmt
        metadata["quantrs.version"] = FORMAT_VERSION
        metadata[TENSORS_KEY] = json.dumps(
            {j.info.name: j.meta for j in jobs if j.kind != "copy"}, separators=(",", ":")
        )
        specs = [o for j in jobs for o in j.outs]
        rows = []
        try:
            writer = StWriter(dst, specs, metadata)
        except OSError as e:  # name the destination, not the temporary file
            raise CliError(f"cannot write {dst}: {e.strerror or e}") from None
        with writer, progress_bar(sum(j.info.nbytes for j in jobs), progress) as bar:
            for j in jobs:
                t = j.info
                bar.set_postfix_str(t.name[-40:], refresh=False)
                try:
                    if j.kind == "copy":
                        writer.write(t.name, _copy_chunks(reader, t))
                        err = None
                    else:
                        got = prepared.of(t.name)
                        if j.kind == "int4":
                            arrays, err = int4_tensor(reader, t, j.meta, group_size, method, got)
                        elif j.kind == "int4_asym":
                            arrays, err = asym_tensor(reader, t, group_size, method, got)
                        elif j.kind == "int4_k":
                            arrays, err = k_tensor(reader, t, method, got)
                        elif j.kind == "gguf":
                            arrays, err = gguf_tensor(reader, t, j.meta["type"], got)
                        else:
                            arrays, err = fp8_tensor(reader, t)
                        for o, a in zip(j.outs, arrays):
                            writer.write(o.name, a)
                        del arrays
                except (ValueError, TypeError) as e:
                    raise CliError(f"tensor {t.name!r}: {e}") from None
                rows.append(_row(j, err))
                bar.update(t.nbytes)
            writer.commit()
    return rows


FORMATS = ("int4", "int4_asym", "int4_k", "fp8", *QUANTIZE_TYPES)
# each format's quantizers (the first is the default; "gptq" needs --calibration); the
# ggml types have llama.cpp's, weighted by the importance of --calibration when given
METHODS = {
    "int4": ("search", "rtn", "full", "gptq"),
    "int4_asym": ("search", "rtn", "gptq"),
    "int4_k": ("search", "rtn", "gptq"),
    "fp8": ("absmax",),
    **{t: ("ggml",) for t in QUANTIZE_TYPES},
}


def check_options(fmt: str, group_size: int, layout: str, method: str | None = None) -> str:
    """Check the options; return the quantizer (``method`` or the format's default)."""
    if fmt not in FORMATS:
        raise CliError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if group_size < 2 or group_size % 2:
        raise CliError(f"--group-size must be even and >= 2, got {group_size}")
    if fmt == "int4_k" and group_size != 32:
        raise CliError(f"--group-size must be 32 for int4_k (its groups), got {group_size}")
    if fmt in QUANTIZE_TYPES and group_size != 32:
        raise CliError(
            f"--group-size does not apply to --format {fmt} (ggml's blocks of "
            f"{block_of(fmt)[0]}), got {group_size}"
        )
    if fmt == "int4_asym" and group_size % 32:
        raise CliError(f"--group-size must be a multiple of 32 for int4_asym, got {group_size}")
    if layout not in LAYOUTS:
        raise CliError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    method = method or METHODS[fmt][0]
    if method not in METHODS[fmt]:
        raise CliError(
            f"--method {method!r} does not apply to --format {fmt} "
            f"(expected one of {', '.join(METHODS[fmt])})"
        )
    return method


def _row(j: Job, err) -> dict:
    t = j.info
    return {
        "name": t.name,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "kind": j.kind if j.kind != "gguf" else f"gguf {j.meta['type']}",
        "bytes_in": t.nbytes,
        "bytes_out": sum(o.nbytes for o in j.outs),
        "rel_err": None if err is None else err[0],
        "max_abs_err": None if err is None else err[1],
        "reason": j.reason or None,
        "outputs": {o.name: o.nbytes for o in j.outs},
    }


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def update(self, n):
        pass

    def set_postfix_str(self, *a, **k):
        pass


def progress_bar(total: int, enabled: bool, desc: str = "quantize"):
    """A tqdm byte counter on stderr (nothing when disabled, without tqdm, or when
    stderr is not a terminal)."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    # disable=None: no bar when stderr is not a terminal (logs, CI)
    return tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, desc=desc, disable=None)


def format_report(rows: list[dict]) -> str:
    from ._table import table

    body = []
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.3e}"
        mx = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3e}"
        shape = "x".join(map(str, r["shape"])) or "scalar"
        kind = r["kind"] + (f" ({r['reason']})" if r.get("reason") else "")
        body.append([r["name"], r["dtype"], shape, kind, r["bytes_in"], r["bytes_out"], err, mx])
    tin = sum(r["bytes_in"] for r in rows)
    tout = sum(r["bytes_out"] for r in rows)
    head = ["tensor", "dtype", "shape", "action", "bytes in", "bytes out", "rel err", "max |err|"]
    return table(head, body) + f"\n{len(rows)} tensors, {tin:,} -> {tout:,} bytes"


def check_out_file(src: Path, dst: Path) -> None:
    """OUT must be a new or replaceable file beside an existing folder, not IN itself."""
    if dst.exists() and src.exists() and dst.samefile(src):
        raise CliError("OUT must differ from IN")
    if dst.is_dir():
        raise CliError(f"OUT {str(dst)!r} is a directory")
    if not dst.parent.is_dir():
        raise CliError(f"output directory {str(dst.parent)!r} does not exist")
