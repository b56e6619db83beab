"""``quantrs quantize IN OUT --format int4|fp8``: quantize a safetensors checkpoint.

Every 2-D floating tensor (F32, F16, BF16, F64) with no zero dimension is
quantized; everything else is copied byte for byte. 2-D tensors are read in the
PyTorch ``nn.Linear`` convention, ``weight[out_features, in_features]``.

Output layouts (also in docs/cli.md):

- ``fp8``: ``<name>`` becomes F8_E4M3 ``[out, in]`` and ``<name>_scale_inv`` a
  F32 scalar, so ``x.weight`` gives ``x.weight`` + ``x.weight_scale_inv``: the
  per-tensor FP8 checkpoint layout that ``PerTensorFP8Linear.from_safetensors(path,
  "x")`` reads. Codes and scale are exactly those of ``PerTensorFP8Linear.from_float``.
- ``int4``: ``<name>.qweight`` U8 ``[num_pairs, out]`` and ``<name>.scales`` F32
  ``[num_groups, out]``: ``QuantizedWeight.quantize(W.T, group_size)``'s ``data`` and
  ``scales`` (groups run along the input dimension). The metadata key
  ``quantrs.tensors`` (JSON) records ``in_feat``, ``out_feat``, ``group_size`` and
  ``num_groups`` per tensor; :func:`load_int4` rebuilds the ``QuantizedWeight``.

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

import numpy as np

from ._errors import CliError
from ._stfile import FLOAT_DTYPES, OutSpec, StFormatError, StReader, StWriter, TensorInfo

FORMAT_KEY = "quantrs.format"
TENSORS_KEY = "quantrs.tensors"
FORMAT_VERSION = "1"
_CHUNK = 16 << 20  # bytes per streamed chunk (copies, transposition)
_ERR_ELEMS = 1 << 20  # elements per chunk of the error report (a few float64 temporaries)


def int4_layout(in_feat: int, group_size: int) -> tuple[int, int, int]:
    """``(effective group size, num_pairs, num_groups)`` of ``QuantizedWeight`` (SPEC 4)."""
    gs = min(group_size, in_feat + in_feat % 2)
    in_padded = -(-in_feat // gs) * gs
    return gs, in_padded // 2, in_padded // gs


@dataclass
class Job:
    info: TensorInfo
    kind: str  # "int4" | "fp8" | "copy"
    outs: list[OutSpec]
    meta: dict = field(default_factory=dict)


def _plan(reader: StReader, fmt: str, group_size: int) -> list[Job]:
    jobs = []
    for t in reader.in_file_order():
        quantize = t.dtype in FLOAT_DTYPES and len(t.shape) == 2 and min(t.shape) > 0
        out_feat, in_feat = t.shape if quantize else (0, 0)
        if not quantize:
            jobs.append(Job(t, "copy", [OutSpec(t.name, t.dtype, t.shape)]))
        elif fmt == "fp8":
            outs = [OutSpec(t.name, "F8_E4M3", t.shape), OutSpec(t.name + "_scale_inv", "F32", ())]
            jobs.append(Job(t, "fp8", outs, {"format": "fp8_e4m3", "dtype": t.dtype}))
        else:
            gs, pairs, groups = int4_layout(in_feat, group_size)
            outs = [
                OutSpec(t.name + ".qweight", "U8", (pairs, out_feat)),
                OutSpec(t.name + ".scales", "F32", (groups, out_feat)),
            ]
            meta = {
                "format": "int4",
                "in_feat": in_feat,
                "out_feat": out_feat,
                "group_size": gs,
                "num_groups": groups,
                "dtype": t.dtype,
            }
            jobs.append(Job(t, "int4", outs, meta))
    seen: dict[str, str] = {}
    for j in jobs:
        for o in j.outs:
            if o.name in seen:
                raise CliError(
                    f"output name {o.name!r} (from {j.info.name!r}) clashes with "
                    f"{seen[o.name]!r}; the input already holds a tensor of that name"
                )
            seen[o.name] = j.info.name
    return jobs


# --- per-tensor kernels --------------------------------------------------------------


def _transposed_f32(reader: StReader, t: TensorInfo) -> np.ndarray:
    """``W.T`` as a new C-contiguous float32 array, copied in 64 x 512 tiles (cache
    friendly) from row blocks whose source pages are dropped once copied (peak: one
    float32 copy of the tensor)."""
    out_feat, in_feat = t.shape
    wt = np.empty((in_feat, out_feat), np.float32)
    src = reader.array(t)
    row_bytes = t.nbytes // out_feat
    step = max(1, min(64, _CHUNK // row_bytes))
    for r0 in range(0, out_feat, step):
        r1 = min(out_feat, r0 + step)
        for c0 in range(0, in_feat, 512):
            tile = src[r0:r1, c0 : c0 + 512]
            if t.dtype == "BF16":  # bfloat16 is the top half of a float32
                tile = (tile.astype(np.uint32) << 16).view(np.float32)
            wt[c0 : c0 + 512, r0:r1] = tile.T  # F16/F64 are cast on assignment
        reader.release(t, r0 * row_bytes, (r1 - r0) * row_bytes)
    return wt


def _int4(reader: StReader, job: Job, group_size: int):
    from .. import QuantizedWeight

    wt = _transposed_f32(reader, job.info)
    qw = QuantizedWeight.quantize(wt, group_size=group_size)
    m = job.meta
    data = np.asarray(qw.data).reshape(job.outs[0].shape)
    scales = np.asarray(qw.scales).reshape(job.outs[1].shape)
    if (qw.in_feat, qw.out_feat, qw.num_groups) != (m["in_feat"], m["out_feat"], m["num_groups"]):
        raise RuntimeError(f"internal error: unexpected INT4 layout for {job.info.name!r}")
    err = _int4_error(wt, data, scales, m["group_size"])
    return [data, scales], err


def _int4_error(wt: np.ndarray, data: np.ndarray, scales: np.ndarray, gs: int):
    """Relative Frobenius and max-abs error of the packed weight against ``wt``,
    dequantized in NumPy chunk by chunk (never a full float32 copy)."""
    in_feat = wt.shape[0]
    acc = _ErrAcc()
    step = max(1, _ERR_ELEMS // (2 * wt.shape[1]))  # pairs per chunk
    for p0 in range(0, data.shape[0], step):
        b = data[p0 : p0 + step]
        q = np.empty((2 * b.shape[0], b.shape[1]), np.int8)
        q[0::2] = (b << 4).view(np.int8) >> 4  # low nibble, sign-extended
        q[1::2] = b.view(np.int8) >> 4  # high nibble, sign-extended
        r0 = 2 * p0
        g = np.arange(r0, r0 + q.shape[0]) // gs
        deq = q.astype(np.float32) * scales[g]
        n = min(q.shape[0], in_feat - r0)
        acc.add(wt[r0 : r0 + n], deq[:n])
    return acc.result()


def _fp8(reader: StReader, job: Job):
    from .. import fp8

    t = job.info
    w = reader.as_float32(t)
    codes, scale = fp8_quantize(fp8, w)
    acc = _ErrAcc()
    step = max(1, _ERR_ELEMS // t.shape[1])
    for r0 in range(0, t.shape[0], step):
        deq = fp8.decode(codes[r0 : r0 + step], "e4m3") * scale
        acc.add(w[r0 : r0 + step], deq)
    del w
    reader.release(t)
    return [codes, np.asarray(scale, np.float32)], acc.result()


def fp8_quantize(fp8, w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """E4M3 codes ``[out, in]`` and ``weight_scale_inv`` of a 2-D float32 ``w``, exactly
    as ``PerTensorFP8Linear.from_float(w)`` computes them (scale ``absmax / 448``, 1 for an
    all-zero tensor; ``encode(w / scale, saturate=True)``; the tests check the two agree
    bit for bit), but row block by row block: ``from_float`` takes a full float32 copy of
    its input first, which would double the peak memory of ``quantize``."""
    rows = max(1, _CHUNK // (4 * w.shape[1]))
    absmax = np.float32(0)
    for r0 in range(0, w.shape[0], rows):
        block = w[r0 : r0 + rows]
        bad = np.flatnonzero(~np.isfinite(block))
        if bad.size:  # NaN would stay NaN and inf would poison the per-tensor scale
            r, c = divmod(int(bad[0]), w.shape[1])
            raise ValueError(f"non-finite value {block[r, c]} at index [{r0 + r}, {c}]")
        absmax = max(absmax, np.abs(block).max(initial=np.float32(0)))
    scale = absmax / np.float32(448) if absmax > 0 else np.float32(1)
    codes = np.empty(w.shape, np.uint8)
    for r0 in range(0, w.shape[0], rows):
        codes[r0 : r0 + rows] = fp8.encode(w[r0 : r0 + rows] / scale, "e4m3", saturate=True)
    return codes, np.float32(scale)


class _ErrAcc:
    """Sums for the relative Frobenius error; float32 per chunk (a report, 3 digits),
    float64 across chunks."""

    def __init__(self):
        self.num = self.den = 0.0
        self.max_abs = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref = np.asarray(ref, np.float32).reshape(-1)
        d = ref - np.asarray(got, np.float32).reshape(-1)
        self.num += float(np.dot(d, d))
        self.den += float(np.dot(ref, ref))
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))

    def result(self) -> tuple[float, float]:
        return (self.num / self.den) ** 0.5 if self.den else 0.0, self.max_abs


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
) -> list[dict]:
    """Quantize ``src`` into ``dst`` (atomically); return one report row per tensor."""
    if fmt not in ("int4", "fp8"):
        raise CliError(f"--format must be int4 or fp8, got {fmt!r}")
    if group_size < 2 or group_size % 2:
        raise CliError(f"--group-size must be even and >= 2, got {group_size}")
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.exists() and dst.samefile(src):
        raise CliError("OUT must differ from IN")
    if dst.is_dir():
        raise CliError(f"OUT {str(dst)!r} is a directory")
    if not dst.parent.is_dir():
        raise CliError(f"output directory {str(dst.parent)!r} does not exist")
    try:
        reader = StReader(src)
    except StFormatError as e:
        raise CliError(f"{src}: not a valid safetensors file: {e}") from None
    with reader:
        if FORMAT_KEY in reader.metadata:
            raise CliError(f"{src} is already quantized by quantrs ({reader.metadata[FORMAT_KEY]})")
        jobs = _plan(reader, fmt, group_size)
        metadata = dict(reader.metadata)
        metadata[FORMAT_KEY] = fmt
        metadata["quantrs.version"] = FORMAT_VERSION
        metadata[TENSORS_KEY] = json.dumps(
            {j.info.name: j.meta for j in jobs if j.kind != "copy"}, separators=(",", ":")
        )
        specs = [o for j in jobs for o in j.outs]
        rows = []
        with StWriter(dst, specs, metadata) as writer, _progress(jobs, progress) as bar:
            for j in jobs:
                t = j.info
                bar.set_postfix_str(t.name[-40:], refresh=False)
                try:
                    if j.kind == "copy":
                        writer.write(t.name, _copy_chunks(reader, t))
                        err = None
                    else:
                        arrays, err = (
                            _int4(reader, j, group_size) if j.kind == "int4" else _fp8(reader, j)
                        )
                        for o, a in zip(j.outs, arrays):
                            writer.write(o.name, a)
                        del arrays
                except (ValueError, TypeError) as e:
                    raise CliError(f"tensor {t.name!r}: {e}") from None
                rows.append(_row(j, err))
                bar.update(t.nbytes)
            writer.commit()
    return rows


def _row(j: Job, err) -> dict:
    t = j.info
    return {
        "name": t.name,
        "dtype": t.dtype,
        "shape": list(t.shape),
        "kind": j.kind,
        "bytes_in": t.nbytes,
        "bytes_out": sum(o.nbytes for o in j.outs),
        "rel_err": None if err is None else err[0],
        "max_abs_err": None if err is None else err[1],
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


def _progress(jobs: list[Job], enabled: bool):
    total = sum(j.info.nbytes for j in jobs)
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    # disable=None: no bar when stderr is not a terminal (logs, CI)
    return tqdm(
        total=total, unit="B", unit_scale=True, file=sys.stderr, desc="quantize", disable=None
    )


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


def format_report(rows: list[dict]) -> str:
    from ._table import table

    body = []
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.3e}"
        mx = "-" if r["max_abs_err"] is None else f"{r['max_abs_err']:.3e}"
        shape = "x".join(map(str, r["shape"])) or "scalar"
        body.append(
            [r["name"], r["dtype"], shape, r["kind"], r["bytes_in"], r["bytes_out"], err, mx]
        )
    tin = sum(r["bytes_in"] for r in rows)
    tout = sum(r["bytes_out"] for r in rows)
    head = ["tensor", "dtype", "shape", "action", "bytes in", "bytes out", "rel err", "max |err|"]
    return table(head, body) + f"\n{len(rows)} tensors, {tin:,} -> {tout:,} bytes"
