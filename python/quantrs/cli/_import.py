"""``quantrs convert IN OUT --from gptq|awq|gguf``: another tool's INT4 checkpoint to
today's quantrs INT4 safetensors layout (the one :func:`quantrs.cli.load_int4` reads).

A GPTQ / AWQ layer ``p`` (``p.qweight``, ``p.qzeros``, ``p.scales``, ``p.g_idx``) becomes
``p.weight.qweight`` + ``p.weight.scales`` (``load_int4(OUT, "p.weight")``); a 2-D GGUF
``Q4_0`` tensor ``n`` becomes ``n.qweight`` + ``n.scales``. Every other tensor (biases,
norms, embeddings; GGUF F32 / F16 / BF16 / integer tensors, with the PyTorch shape) is
copied. Exact where the format allows (docs/checkpoints.md); other tensors are refused
with the reason, or with ``--requantize`` dequantized and re-quantized, the error in
the report. Layers are read one at a time and streamed to a temporary file renamed over
OUT at the end, like ``quantize``.
"""

from __future__ import annotations

import json
import os
import warnings
from functools import partial
from pathlib import Path

import numpy as np

from ..formats import Checkpoint, FormatError, GgufFile, UnsupportedFormatError
from ..formats._stfile import OutSpec, StWriter
from ..formats.awq import awq_geometry, awq_layers, read_awq
from ..formats.gguf import PACKED_TYPES, Q4_0, packed_weight, read_gguf_weight
from ..formats.gptq import gptq_geometry, gptq_layers, read_gptq
from ._errors import CliError
from ._layout import FORMAT_KEY, FORMAT_VERSION, TENSORS_KEY, check_unique_outputs, int4_outputs
from ._quantize import progress_bar

SOURCES = ("gptq", "awq", "gguf")
# GGUF plain types copied as safetensors tensors: ggml type name -> safetensors dtype
# GGUF's embedding tables (llama.cpp's tensor names): block-quantized ones are written
# as float32 (every ggml value is an exact float32), not refused as non-Q4_0 linears.
_GGUF_EMBEDDINGS = frozenset({"token_embd.weight"})
_GGUF_COPY = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8",
              "I16": "I16", "I32": "I32", "I64": "I64"}  # fmt: skip


def _qw_arrays(qw, outs) -> list[np.ndarray]:
    data = np.asarray(qw.data).reshape(-1, qw.out_feat)
    scales = np.asarray(qw.scales).reshape(-1, qw.out_feat)
    if (data.shape, scales.shape) != (outs[0].shape, outs[1].shape):
        raise RuntimeError(f"internal error: unexpected INT4 layout for {outs[0].name!r}")
    return [data, scales]


class _Job:
    def __init__(self, name, dtype, shape, kind, outs, bytes_in, run, meta=None, reason=""):
        self.name, self.dtype, self.shape, self.kind = name, dtype, shape, kind
        self.outs, self.bytes_in, self.run, self.meta, self.reason = (
            outs,
            bytes_in,
            run,
            meta,
            reason,
        )


def _plan_safetensors(ck: Checkpoint, source: str, requantize: bool) -> list[_Job]:
    layers = gptq_layers(ck) if source == "gptq" else awq_layers(ck)
    geometry = gptq_geometry if source == "gptq" else awq_geometry
    # convert writes quantrs INT4 only: no int_zp weights (docs/checkpoints.md)
    read = partial(read_gptq if source == "gptq" else read_awq, into="int4")
    owned = set()
    jobs = []
    for p in layers:
        geo = geometry(ck, p)
        gs = geo["group_size"] if geo["group_size"] % 2 == 0 else 32
        outs, meta = int4_outputs(
            p + ".weight", geo["in_feat"], geo["out_feat"], gs, source.upper()
        )
        parts = [f"{p}.{k}" for k in ("qweight", "qzeros", "scales", "g_idx") if f"{p}.{k}" in ck]
        owned.update(parts)

        def run(p=p, outs=outs):
            imp = read(ck, p, requantize)
            return _qw_arrays(imp.qweight, outs), imp.error, imp.note

        nbytes = sum(ck.info(n).nbytes for n in parts)
        shape = [geo["out_feat"], geo["in_feat"]]
        jobs.append(_Job(p, source.upper(), shape, "int4", outs, nbytes, run, meta))
    for n in ck.names():
        if n in owned:
            continue
        t = ck.info(n)

        def copy(t=t):
            return [np.array(ck.reader(t.name).raw(t))], None, ""

        jobs.append(
            _Job(n, t.dtype, list(t.shape), "copy", [OutSpec(n, t.dtype, t.shape)], t.nbytes, copy)
        )
    return jobs


def _plan_gguf(g: GgufFile, requantize: bool) -> list[_Job]:
    jobs = []
    for t in g.tensors.values():
        tname = t.type_name
        if tname in _GGUF_COPY:

            def copy(t=t):
                return [np.array(g.raw(t))], None, ""

            out = OutSpec(t.name, _GGUF_COPY[tname], t.shape)
            jobs.append(_Job(t.name, tname, list(t.shape), "copy", [out], t.nbytes, copy))
            continue
        if t.name in _GGUF_EMBEDDINGS and tname in PACKED_TYPES:
            # A lookup table, not a linear: stored as its exact float32 values.
            def embed(t=t, tname=tname):
                return [packed_weight(g, t).dequantize()], None, f"{tname} dequantized exactly"

            out = OutSpec(t.name, "F32", t.shape)
            jobs.append(_Job(t.name, tname, list(t.shape), "copy", [out], t.nbytes, embed))
            continue
        if len(t.dims) != 2 or (t.type_id != Q4_0 and not requantize):
            why = "not 2-D" if len(t.dims) != 2 else f"ggml type {tname} is not Q4_0"
            raise UnsupportedFormatError(
                f"tensor {t.name!r}: {why}: not representable in quantrs INT4 exactly"
                + ("" if len(t.dims) != 2 else " (--requantize dequantizes and re-quantizes it)")
            )
        in_feat, out_feat = t.dims
        outs, meta = int4_outputs(t.name, in_feat, out_feat, 32, tname)

        def run(t=t, outs=outs):
            qw, err, note = read_gguf_weight(g, t.name, requantize)
            return _qw_arrays(qw, outs), err, note

        jobs.append(_Job(t.name, tname, list(t.shape), "int4", outs, t.nbytes, run, meta))
    return jobs


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    source: str,
    requantize: bool = False,
    progress: bool = True,
) -> list[dict]:
    """Convert ``src`` (GPTQ / AWQ file or folder, or a GGUF file) into the quantrs
    INT4 safetensors file ``dst``; one report row per tensor or layer."""
    if source not in SOURCES:
        raise CliError(f"--from must be one of {', '.join(SOURCES)}, got {source!r}")
    src, dst = Path(src), Path(dst)
    if dst.is_dir():
        raise CliError(f"OUT {str(dst)!r} is a directory")
    if not dst.parent.is_dir():
        raise CliError(f"output directory {str(dst.parent)!r} does not exist")
    if dst.exists() and src.exists() and dst.samefile(src):
        raise CliError("OUT must differ from IN")
    try:
        opened = GgufFile(src) if source == "gguf" else Checkpoint(src)
        with opened as f:
            jobs = (
                _plan_gguf(f, requantize)
                if source == "gguf"
                else _plan_safetensors(f, source, requantize)
            )
            if source != "gguf" and not any(j.kind == "int4" for j in jobs):
                raise UnsupportedFormatError(
                    f"{src}: no {source.upper()} layer (no '<layer>.qweight' tensor)"
                )
            return _write(jobs, dst, source, progress)
    except FormatError as e:
        raise CliError(str(e)) from None


def _write(jobs, dst: Path, source: str, progress: bool) -> list[dict]:
    check_unique_outputs((j.name, j.outs) for j in jobs)
    metadata = {
        FORMAT_KEY: "int4",
        "quantrs.version": FORMAT_VERSION,
        "quantrs.source": source,
        TENSORS_KEY: json.dumps(
            {j.outs[0].name[: -len(".qweight")]: j.meta for j in jobs if j.kind == "int4"},
            separators=(",", ":"),
        ),
    }
    rows = []
    try:
        writer = StWriter(dst, [o for j in jobs for o in j.outs], metadata)
    except OSError as e:
        raise CliError(f"cannot write {dst}: {e.strerror or e}") from None
    bar = progress_bar(sum(j.bytes_in for j in jobs), progress, "convert")
    with writer, bar, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the error goes into the report instead
        for j in jobs:
            bar.set_postfix_str(j.name[-40:], refresh=False)
            try:
                arrays, err, note = j.run()
            except (ValueError, TypeError) as e:
                raise CliError(f"{j.name!r}: {e}") from None
            for o, a in zip(j.outs, arrays):
                writer.write(o.name, a)
            exact = j.kind == "int4" and err is None
            rows.append(
                {
                    "name": j.name,
                    "dtype": j.dtype,
                    "shape": j.shape,
                    "kind": j.kind
                    + (" requantized" if err is not None else " exact" if exact else ""),
                    "bytes_in": j.bytes_in,
                    "bytes_out": sum(o.nbytes for o in j.outs),
                    "rel_err": 0.0 if exact else None if err is None else err[0],
                    "max_abs_err": 0.0 if exact else None if err is None else err[1],
                    "reason": note or None,
                    "outputs": {o.name: o.nbytes for o in j.outs},
                }
            )
            bar.update(j.bytes_in)
        writer.commit()
    return rows
