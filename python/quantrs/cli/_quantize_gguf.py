"""``quantrs quantize IN.gguf OUT.gguf --format q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k``:
a GGUF model re-quantized into a GGUF model that llama.cpp loads, as ``llama-quantize
IN OUT TYPE`` makes one (docs/cli.md "GGUF output").

- Every key/value pair of IN is copied as its bytes, in order, except
  ``general.file_type`` (set to llama.cpp's ``LLAMA_FTYPE_MOSTLY_*`` of the type asked,
  :data:`FILE_TYPES`) and ``general.quantization_version`` (2, ggml's
  ``GGML_QNT_VERSION``), which are added at the end when IN lacks them.
- The tensors :meth:`Selector.choose_gguf` picks (by default the block linears
  ``blk.<i>.<x>.weight``, the layers the safetensors output quantizes) are decoded to
  float32 and quantized with ``GgufWeight.quantize`` (llama.cpp's quantizers, the code path
  of the safetensors output, weighted by ``--calibration``'s importance), the type given
  by llama.cpp's fallback rule (:mod:`quantrs.formats._ggml_types`). A chosen tensor that
  already has the type it would get is copied, as llama.cpp does; one whose ggml type
  quantrs cannot decode (the IQ types) is copied and the report says so.
- Every other tensor (``token_embd``, ``output``, norms, biases) is copied byte for byte
  with its type.
- Tensors keep IN's header order; offsets are multiples of IN's ``general.alignment``
  (32 when absent); the file is written to a temporary sibling renamed over OUT at the
  end (:class:`quantrs.formats.gguf_rewrite.GgufStreamWriter`).

Memory: IN is memory-mapped; one tensor at a time is decoded (one float32 copy of it plus
its quantized bytes), and copied tensors stream in chunks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..formats import FormatError, GgufFile
from ..formats._ggml_types import QUANTIZE_TYPES, fallback_note, type_for
from ..formats.gguf import GGML_TYPES, MAGIC, PACKED_TYPES, GgufTensor, packed_weight
from ..formats.gguf_rewrite import GgufStreamWriter, TensorOut, kv_records, kv_u32
from ._convert import quantize_rows
from ._errors import CliError
from ._prepared import Prepared
from ._quantize import check_options, check_out_file, progress_bar
from ._select import Selector

# --format -> llama.cpp's llama_ftype (include/llama.h; gguf-py's LlamaFileType): the k-quants
# get the "_S" value, which llama-quantize --pure also writes (every chosen tensor the one
# type or its fallback, none of the _S / _M mixes' upgrades)
FILE_TYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k": 14, "q5_k": 16,
              "q6_k": 18}  # fmt: skip
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION, which llama-quantize writes
_TYPE_IDS = {name.lower(): tid for tid, (name, _, _) in GGML_TYPES.items()}
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
_CHUNK = 16 << 20  # bytes per streamed chunk of a copied tensor


def is_gguf(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a GGUF file: it ends in ``.gguf`` or starts with ``GGUF``."""
    if str(path).lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:  # a folder, a missing file: not GGUF, the caller says what it is
        return False


def not_gguf_message(src: str) -> str:
    """Why a .gguf OUT cannot be made from IN ``src`` (a model folder or safetensors
    file), and how to make one."""
    what = "a model folder" if os.path.isdir(src) else "not a GGUF file"
    return (
        f"IN {src!r} is {what}: a .gguf OUT is made from a GGUF IN, whose metadata and "
        "vocabulary it keeps (docs/cli.md, 'GGUF output'). Convert the Hugging Face model "
        "with llama.cpp's convert_hf_to_gguf.py first (python convert_hf_to_gguf.py FOLDER "
        "--outtype f32 --outfile model-f32.gguf), then run quantrs quantize model-f32.gguf "
        "OUT.gguf --format TYPE; or give an OUT not ending in .gguf for quantrs' "
        "safetensors layout"
    )


@dataclass
class _Job:
    t: GgufTensor
    out: TensorOut
    gtype: str | None  # the ggml type it is quantized to; None: copied
    reason: str = ""


def plan(g: GgufFile, fmt: str, selector: Selector) -> list[_Job]:
    """One job per tensor of ``g``, in header order."""
    jobs = []
    for t in g.tensors.values():
        chosen, reason = selector.choose_gguf(t.name, len(t.dims))
        used = None
        if chosen:
            in_feat = t.dims[0]
            used = type_for(fmt, in_feat)
            if used is None:
                reason = fallback_note(fmt, None, in_feat)
            elif used == t.type_name.lower():
                used, reason = None, f"already {used}: copied (as llama.cpp does)"
            elif t.type_name not in _FLOAT_TYPES and t.type_name not in PACKED_TYPES:
                used, reason = None, f"ggml type {t.type_name}: not a type quantrs decodes, copied"
            else:
                reason = fallback_note(fmt, used, in_feat)
        type_id = t.type_id if used is None else _TYPE_IDS[used]
        jobs.append(_Job(t, TensorOut(t.name, t.dims, type_id), used, reason))
    return jobs


def metadata(g: GgufFile, fmt: str) -> list[bytes]:
    """IN's key/value pairs as bytes, with ``general.file_type`` and
    ``general.quantization_version`` set (in place, or added at the end)."""
    new = {
        "general.file_type": kv_u32("general.file_type", FILE_TYPES[fmt]),
        "general.quantization_version": kv_u32(
            "general.quantization_version", QUANTIZATION_VERSION
        ),
    }
    out = [new.pop(key, raw) for key, raw in kv_records(g)]
    return out + list(new.values())


def float_weight(g: GgufFile, t: GgufTensor) -> np.ndarray:
    """The 2-D tensor ``t`` as a new float32 ``[out, in]`` array: float types cast, block
    types dequantized exactly by ``GgufWeight`` (bit for bit ``gguf.quants.dequantize``)."""
    if t.type_name == "F64":
        return g.raw(t).view("<f8").astype(np.float32).reshape(t.shape)
    if t.type_name in _FLOAT_TYPES:
        return g.dequantize(t)
    return packed_weight(g, t).dequantize()


def _chunks(g: GgufFile, t: GgufTensor):
    raw = g.raw(t)
    for b0 in range(0, t.nbytes, _CHUNK):
        yield raw[b0 : b0 + _CHUNK]


def check_gguf_options(fmt: str, group_size: int, method: str | None) -> None:
    """The options of a GGUF OUT: a ggml block type, its quantizer, blocks of 32."""
    if fmt not in QUANTIZE_TYPES:
        raise CliError(
            f"--format {fmt!r} cannot be written to a .gguf OUT: expected a ggml block type "
            f"({', '.join(QUANTIZE_TYPES)}); int4, int4_asym, int4_k and fp8 write quantrs' "
            "safetensors layout (an OUT not ending in .gguf)"
        )
    check_options(fmt, group_size, "compressed-tensors", method)


def quantize_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    fmt: str,
    group_size: int = 32,
    progress: bool = True,
    selector: Selector | None = None,
    method: str | None = None,
    prepared: Prepared | None = None,
) -> tuple[list[dict], dict]:
    """Re-quantize the GGUF file ``src`` into the GGUF file ``dst`` (atomically);
    ``(one report row per tensor, summary)``. ``prepared``: the importance per GGUF
    tensor name that ``--calibration`` gave."""
    check_gguf_options(fmt, group_size, method)
    prepared = prepared or Prepared()
    selector = selector or Selector()
    src, dst = Path(src), Path(dst)
    check_out_file(src, dst)
    try:
        with GgufFile(src) as g:
            return _write(g, dst, fmt, selector, prepared, progress)
    except FormatError as e:
        raise CliError(str(e)) from None


def _write(g: GgufFile, dst: Path, fmt: str, selector, prepared, progress) -> tuple[list, dict]:
    from .. import GgufWeight

    jobs = plan(g, fmt, selector)
    try:
        writer = GgufStreamWriter(dst, metadata(g, fmt), [j.out for j in jobs], g.alignment)
    except OSError as e:  # name the destination, not the temporary file
        raise CliError(f"cannot write {dst}: {e.strerror or e}") from None
    rows = []
    with writer, progress_bar(sum(j.t.nbytes for j in jobs), progress) as bar:
        for j in jobs:
            t = j.t
            bar.set_postfix_str(t.name[-40:], refresh=False)
            err = None
            if j.gtype is None:
                writer.write(t.name, _chunks(g, t))
            else:
                gtype = j.gtype

                def quantize(w, importance, gtype=gtype):
                    return GgufWeight.quantize(w, gtype, importance=importance)

                w = float_weight(g, t)  # a corrupt block raises FormatError naming it
                try:
                    packed, err = quantize_rows(w, quantize, prepared.of(t.name))
                except (ValueError, TypeError) as e:
                    raise CliError(f"tensor {t.name!r}: {e}") from None
                writer.write(t.name, np.asarray(packed.to_bytes()))
                del packed, w
            rows.append(_row(j, err))
            bar.update(t.nbytes)
        writer.commit()
    summary = {
        "input": str(g.path),
        "output": str(dst),
        "format": fmt,
        "file_type": FILE_TYPES[fmt],
        "alignment": g.alignment,
        "quantized": sum(j.gtype is not None for j in jobs),
    }
    return rows, summary


def _row(j: _Job, err) -> dict:
    t = j.t
    return {
        "name": t.name,
        "dtype": t.type_name,
        "shape": list(t.shape),
        "kind": "copy" if j.gtype is None else f"gguf {j.gtype}",
        "bytes_in": t.nbytes,
        "bytes_out": j.out.nbytes,
        "rel_err": None if err is None else err[0],
        "max_abs_err": None if err is None else err[1],
        "reason": j.reason or None,
        "outputs": {t.name: j.out.nbytes},
    }
