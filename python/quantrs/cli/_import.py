"""``quantrs convert IN OUT --from gptq|awq|gguf``: another tool's checkpoint to quantrs'
safetensors layout (:mod:`quantrs.formats.own_layout`), keeping the exact bits.

Each packed layer is written in the quantrs type that holds it exactly:

- GPTQ / AWQ layer ``p`` (``p.qweight``, ``p.qzeros``, ``p.scales``, ``p.g_idx``):
  ``p.weight`` as INT4 (``p.weight.qweight`` + ``p.weight.scales``, what
  :func:`quantrs.cli.load_int4` reads) when symmetric 4-bit in input order, else as
  ``int_zp`` (zero points, 8-bit, act-order);
- GGUF 2-D tensor ``n``: ``Q4_0`` as INT4 group 32, ``Q4_1`` as ``int4_asym`` group 32,
  every other block type (``Q8_0``, ``Q5_x``, k-quants) as its ggml blocks (``gguf``),
  the embedding table ``token_embd.weight`` included (a lookup reads its rows with
  ``dequantize_rows``).

Every other tensor (biases, norms; GGUF F32 / F16 / BF16 / integer tensors, with the
PyTorch shape) is copied. What no quantrs type holds (GPTQ 2-bit, AWQ shapes int_zp cannot
take, GGUF IQ types) is refused naming the tensor and the reason, or with ``--requantize``
dequantized and re-quantized to INT4, the error in the report. Layers are read one at a
time and streamed to a temporary file renamed over OUT at the end, like ``quantize``.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np

from .. import QuantizedWeight
from ..formats import Checkpoint, FormatError, GgufFile, UnsupportedFormatError
from ..formats._stfile import OutSpec, StWriter
from ..formats.awq import awq_layers, read_awq
from ..formats.gguf import PACKED_TYPES, exact_packed, read_gguf_weight
from ..formats.gptq import gptq_layers, read_gptq
from ..formats.own_layout import own_arrays, own_outputs
from ._errors import CliError
from ._layout import FORMAT_KEY, FORMAT_VERSION, TENSORS_KEY, check_unique_outputs, int4_outputs
from ._quantize import progress_bar

SOURCES = ("gptq", "awq", "gguf")
# GGUF plain types copied as safetensors tensors: ggml type name -> safetensors dtype
_GGUF_COPY = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F64": "F64", "I8": "I8",
              "I16": "I16", "I32": "I32", "I64": "I64"}  # fmt: skip


def _packed_job(row: str, name: str, src_dtype: str, weight, bytes_in: int, read) -> _Job:
    """The job (report row ``row``) writing ``weight`` (a sample of what ``read()``
    returns: same type and shapes) under ``name``; ``read() -> (weight, error or None,
    note)``."""
    if isinstance(weight, QuantizedWeight):
        outs, meta = int4_outputs(
            name, weight.in_feat, weight.out_feat, weight.group_size, src_dtype
        )

        def run():
            qw, err, note = read()
            return _qw_arrays(qw, outs), err, note

        shape = [weight.out_feat, weight.in_feat]
        return _Job(row, src_dtype, shape, "int4", outs, bytes_in, run, meta)
    outs, meta = own_outputs(name, weight, src_dtype)

    def run_own():
        w, err, note = read()
        return own_arrays(w), err, note

    kind = meta["format"] if meta["format"] != "gguf" else f"gguf {meta['type']}"
    return _Job(row, src_dtype, list(weight.shape), kind, outs, bytes_in, run_own, meta)


def _qw_arrays(qw, outs) -> list[np.ndarray]:
    data = np.asarray(qw.data).reshape(-1, qw.out_feat)
    scales = np.asarray(qw.scales).reshape(-1, qw.out_feat)
    if (data.shape, scales.shape) != (outs[0].shape, outs[1].shape):
        raise RuntimeError(f"internal error: unexpected INT4 layout for {outs[0].name!r}")
    return [data, scales]


class _Job:
    """One output: ``run() -> (arrays for outs, error or None, note)``; ``meta``: the
    ``quantrs.tensors`` entry of a packed weight (None for a copy)."""

    def __init__(self, name, dtype, shape, kind, outs, bytes_in, run, meta=None):
        self.name, self.dtype, self.shape, self.kind = name, dtype, shape, kind
        self.outs, self.bytes_in, self.run, self.meta = outs, bytes_in, run, meta

    @property
    def weight_name(self) -> str:
        """The packed weight's name in ``quantrs.tensors``."""
        return self.outs[0].name.rsplit(".", 1)[0]


def _plan_safetensors(ck: Checkpoint, source: str, requantize: bool) -> list[_Job]:
    layers = gptq_layers(ck) if source == "gptq" else awq_layers(ck)
    reader = read_gptq if source == "gptq" else read_awq
    owned = set()
    jobs = []
    for p in layers:
        parts = [f"{p}.{k}" for k in ("qweight", "qzeros", "scales", "g_idx") if f"{p}.{k}" in ck]
        owned.update(parts)

        def read(p=p):
            imp = reader(ck, p, requantize)
            return imp.qweight, imp.error, imp.note

        with warnings.catch_warnings():  # the planning read; the error is reported later
            warnings.simplefilter("ignore")
            sample = read()[0]  # one layer in memory, dropped at once
        nbytes = sum(ck.info(n).nbytes for n in parts)
        jobs.append(_packed_job(p, p + ".weight", source.upper(), sample, nbytes, read))
        del sample
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
        if len(t.dims) == 2 and tname in PACKED_TYPES:

            def exact(t=t):
                return exact_packed(g, t), None, ""

            sample = exact(t)[0]
            jobs.append(_packed_job(t.name, t.name, tname, sample, t.nbytes, exact))
            del sample
            continue
        if len(t.dims) != 2 or not requantize:
            why = "not 2-D" if len(t.dims) != 2 else f"no quantrs type holds ggml type {tname}"
            raise UnsupportedFormatError(
                f"tensor {t.name!r}: {why}: not representable exactly"
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
            if source != "gguf" and not any(j.meta is not None for j in jobs):
                raise UnsupportedFormatError(
                    f"{src}: no {source.upper()} layer (no '<layer>.qweight' tensor)"
                )
            return _write(jobs, dst, source, progress)
    except FormatError as e:
        raise CliError(str(e)) from None


def _write(jobs, dst: Path, source: str, progress: bool) -> list[dict]:
    check_unique_outputs((j.name, j.outs) for j in jobs)
    packed = [j for j in jobs if j.meta is not None]
    metadata = {
        FORMAT_KEY: "int4" if all(j.kind == "int4" for j in packed) else "packed",
        "quantrs.version": FORMAT_VERSION,
        "quantrs.source": source,
        TENSORS_KEY: json.dumps({j.weight_name: j.meta for j in packed}, separators=(",", ":")),
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
            exact = j.meta is not None and err is None
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
