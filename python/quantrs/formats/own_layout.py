"""quantrs' own safetensors layout for packed weights: what ``quantrs quantize --format
int4`` and ``quantrs convert`` write, and reading it back (docs/cli.md,
docs/checkpoints.md).

Each shard's metadata holds ``quantrs.format`` (the file's format), ``quantrs.version``
and ``quantrs.tensors``, a JSON object giving, per weight name ``n``, its ``format`` and
sizes; the packed parts are tensors named ``n.<part>``:

- ``int4`` (``QuantizedWeight``): ``n.qweight`` U8 ``[num_pairs, out]``, ``n.scales`` F32
  ``[num_groups, out]``.
- ``int4_asym`` (``Int4AsymWeight``): ``n.codes`` U8 ``[out, in / 2]`` (each run of 32
  inputs in 16 bytes, byte ``j`` holding input ``j`` low and ``j + 16`` high: ggml
  ``Q4_1``'s order), ``n.scales`` F16 ``[out, groups, 2]`` (step ``d``, minimum ``m``).
- ``int4_k`` (``Int4KWeight``): ``n.codes`` U8 ``[out, in / 2]`` packed as above,
  ``n.scale_codes`` U8 ``[out, (3 * groups + 1) / 2]``: the 6-bit step and minimum codes
  ``(sc, mn)`` of each group of 32 in group order, a little-endian bit stream (group
  ``g``'s 12 bits ``sc | mn << 6``; an odd last group leaves a high nibble of 0), as
  ``Int4KWeight``'s own serialization (docs/int4.md); ``n.supers`` F16 ``[out, supers,
  2]`` (``D``, ``Dmin`` per super-block). Exactly ``Int4KWeight.nbytes``: 4.5 bits per
  weight at super-block 256.
- ``int_zp`` (``IntZpWeight``): ``n.codes`` U8, 4-bit ``[out, in / 2]`` packed as above or
  8-bit ``[out, in]``, inputs in stored order; ``n.scales`` F16 and ``n.zeros`` U8
  ``[out, groups]``; ``n.perm`` I64 ``[in]`` when the inputs are permuted (act-order).
- ``gguf`` (``GgufWeight``): ``n.blocks`` U8 ``[out, bytes per row]``, the ggml blocks as
  the GGUF file has them; the entry's ``type`` names the block type (``q8_0``, ``q6_k``).

Every entry has ``in_feat`` and ``out_feat`` (the PyTorch ``[out, in]`` weight) and the
source ``dtype``; each part is checked by the weight's own constructor when read.
"""

from __future__ import annotations

import json

import numpy as np

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, TensorNotFoundError

FORMAT_KEY = "quantrs.format"
TENSORS_KEY = "quantrs.tensors"
FORMAT_VERSION = "1"
_FIRST_PART = (".qweight", ".codes", ".blocks")
# every format of this layout, for readers that take any packed weight
ALL_FORMATS = ("int4", "int4_asym", "int4_k", "int_zp", "gguf")
_RUN = 32  # inputs per run of 4-bit codes


def own_entry(ck: Checkpoint, name: str) -> dict | None:
    """The ``quantrs.tensors`` entry of packed weight ``name`` (None when ``name`` is not
    a packed weight of this layout)."""
    first = next((name + p for p in _FIRST_PART if name + p in ck), None)
    if first is None:
        return None
    try:
        table = json.loads(ck.reader(first).metadata.get(TENSORS_KEY, "{}"))
    except ValueError as e:
        raise CorruptCheckpointError(f"{ck.path}: metadata {TENSORS_KEY!r}: {e}") from None
    entry = table.get(name) if isinstance(table, dict) else None
    return entry if isinstance(entry, dict) else None


def pack_runs(codes: np.ndarray) -> np.ndarray:
    """uint8 codes ``[out, in]`` (0..15, ``in`` a multiple of 32) as ``[out, in / 2]``
    bytes: per run of 32 inputs, byte ``j`` = input ``j`` | input ``j + 16`` << 4."""
    out_f, in_f = codes.shape
    r = codes.reshape(out_f, in_f // _RUN, 2, _RUN // 2)
    return (r[:, :, 0] | (r[:, :, 1] << np.uint8(4))).reshape(out_f, in_f // 2)


def unpack_runs(packed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`pack_runs`."""
    out_f, half = packed.shape
    r = packed.reshape(out_f, half // (_RUN // 2), 1, _RUN // 2)
    return np.concatenate([r & np.uint8(0x0F), r >> np.uint8(4)], axis=2).reshape(out_f, 2 * half)


def pack_six(codes: np.ndarray) -> np.ndarray:
    """uint8 6-bit codes ``[out, ...]`` (each 0..63), flattened per row, as a
    little-endian bit stream of ``ceil(6 n / 8)`` bytes per row (module docstring)."""
    flat = codes.reshape(codes.shape[0], -1)
    n = flat.shape[1]
    v = np.pad(flat, ((0, 0), (0, -n % 4))).reshape(flat.shape[0], -1, 4)
    a, b, c, d = (v[:, :, i] for i in range(4))
    packed = np.stack([a | (b << 6), (b >> 2) | (c << 4), (c >> 4) | (d << 2)], axis=2)
    return np.ascontiguousarray(packed.reshape(flat.shape[0], -1)[:, : -(-6 * n // 8)])


def unpack_six(packed: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` codes per row of :func:`pack_six`'s bytes, ``[out, count]``; padding
    bits that are not zero raise ``SerializationError``."""
    from .. import SerializationError

    if packed.ndim != 2 or packed.shape[1] != -(-6 * count // 8):
        raise SerializationError(
            f"scale_codes: expected [rows, {-(-6 * count // 8)}] bytes, got {list(packed.shape)}"
        )
    t = np.pad(packed, ((0, 0), (0, -packed.shape[1] % 3))).reshape(packed.shape[0], -1, 3)
    b0, b1, b2 = (t[:, :, i] for i in range(3))
    six = np.uint8(63)
    v = np.stack([b0 & six, (b0 >> 6) | ((b1 << 2) & six), (b1 >> 4) | ((b2 << 4) & six),
                  b2 >> 2], axis=2).reshape(packed.shape[0], -1)  # fmt: skip
    bad = np.argwhere(v[:, count:] != 0)
    if len(bad):
        raise SerializationError(f"scale_codes: row {bad[0][0]}: padding bits are not zero")
    return v[:, :count]


def own_outputs(name: str, weight, src_dtype: str) -> tuple[list, dict]:
    """The tensors (:class:`OutSpec`) and the ``quantrs.tensors`` entry that
    :func:`own_arrays` fills for a packed ``Int4AsymWeight``, ``Int4KWeight``,
    ``IntZpWeight`` or ``GgufWeight`` ``weight`` named ``name``."""
    from ._stfile import OutSpec

    out_f, in_f = weight.shape
    meta = {"format": weight.type, "in_feat": in_f, "out_feat": out_f, "dtype": src_dtype}
    if weight.type == "int4_asym":
        return asym_outputs(name, in_f, out_f, weight.group_size, src_dtype)
    if weight.type == "int4_k":
        return k_outputs(name, in_f, out_f, weight.super_block, src_dtype)
    if weight.type == "int_zp":
        groups = -(-in_f // weight.group_size)
        meta.update(group_size=weight.group_size, bits=weight.bits)
        outs = [
            OutSpec(name + ".codes", "U8", (out_f, in_f * weight.bits // 8)),
            OutSpec(name + ".scales", "F16", (out_f, groups)),
            OutSpec(name + ".zeros", "U8", (out_f, groups)),
        ]
        if weight.perm is not None:
            outs.append(OutSpec(name + ".perm", "I64", (in_f,)))
    else:
        meta["format"], meta["type"] = "gguf", weight.type
        outs = [OutSpec(name + ".blocks", "U8", (out_f, weight.nbytes // out_f))]
    return outs, meta


def asym_outputs(
    name: str, in_feat: int, out_feat: int, group_size: int, src_dtype: str
) -> tuple[list, dict]:
    """The tensors and entry of an ``int4_asym`` weight ``[out_feat, in_feat]``."""
    from ._stfile import OutSpec

    groups = -(-in_feat // group_size)
    meta = {"format": "int4_asym", "in_feat": in_feat, "out_feat": out_feat,
            "dtype": src_dtype, "group_size": group_size}  # fmt: skip
    outs = [
        OutSpec(name + ".codes", "U8", (out_feat, in_feat // 2)),
        OutSpec(name + ".scales", "F16", (out_feat, groups, 2)),
    ]
    return outs, meta


def k_outputs(
    name: str, in_feat: int, out_feat: int, super_block: int, src_dtype: str
) -> tuple[list, dict]:
    """The tensors and entry of an ``int4_k`` weight ``[out_feat, in_feat]`` with
    ``super_block`` inputs per super-block (``Int4KWeight.super_block``)."""
    from ._stfile import OutSpec

    meta = {"format": "int4_k", "in_feat": in_feat, "out_feat": out_feat,
            "dtype": src_dtype, "group_size": _RUN, "super_block": super_block}  # fmt: skip
    outs = [
        OutSpec(name + ".codes", "U8", (out_feat, in_feat // 2)),
        OutSpec(name + ".scale_codes", "U8", (out_feat, (3 * (in_feat // _RUN) + 1) // 2)),
        OutSpec(name + ".supers", "F16", (out_feat, in_feat // super_block, 2)),
    ]
    return outs, meta


def k_super_block(in_feat: int) -> int:
    """``Int4KWeight``'s super-block for ``in_feat`` inputs: 256 where it divides them,
    else the whole row (docs/int4.md "k-quant-style INT4")."""
    return 256 if in_feat % 256 == 0 else in_feat


def own_arrays(weight) -> list[np.ndarray]:
    """The arrays of :func:`own_outputs`'s tensors, in its order."""
    if weight.type == "int4_asym":
        return [pack_runs(weight.codes()), weight.scales().astype(np.float16)]
    if weight.type == "int4_k":
        return [
            pack_runs(weight.codes()),
            pack_six(np.array(weight.scale_codes())),
            weight.supers().astype(np.float16),
        ]
    if weight.type == "int_zp":
        codes = weight.codes()
        arrays = [
            pack_runs(codes) if weight.bits == 4 else codes,
            weight.scales().astype(np.float16),
            weight.zeros(),
        ]
        if weight.perm is not None:
            arrays.append(np.asarray(weight.perm, np.int64))
        return arrays
    return [np.asarray(weight.to_bytes()).reshape(weight.shape[0], -1)]


def read_own(ck: Checkpoint, name: str, formats: tuple[str, ...] = ("int4",)):
    """The packed weight ``name`` of an open checkpoint in this layout, if its format is
    one of ``formats``: a ``QuantizedWeight`` ``[in, out]`` for ``int4``; an
    ``Int4AsymWeight``, ``Int4KWeight``, ``IntZpWeight`` or ``GgufWeight`` ``[out, in]``
    for the others."""
    from .. import QuantError

    entry = own_entry(ck, name)
    if entry is None or entry.get("format") not in formats:
        what = "quantrs INT4" if formats == ("int4",) else "packed quantrs"
        raise TensorNotFoundError(f"{ck.path} holds no {what} tensor {name!r}")
    try:
        return _READERS[entry["format"]](ck, name, entry)
    except (KeyError, TypeError, ValueError, QuantError) as e:
        raise CorruptCheckpointError(f"{ck.path}: {entry['format']} tensor {name!r}: {e}") from None


def _read_int4(ck: Checkpoint, name: str, entry: dict):
    from .. import QuantizedWeight

    data = ck.array(name + ".qweight", ("U8",)).reshape(-1)
    scales = ck.array(name + ".scales", ("F32",)).reshape(-1)
    return QuantizedWeight(
        data, scales, int(entry["in_feat"]), int(entry["out_feat"]), int(entry["num_groups"])
    )


def _read_int4_asym(ck: Checkpoint, name: str, entry: dict):
    from .. import Int4AsymWeight

    codes = unpack_runs(ck.array(name + ".codes", ("U8",)))
    scales = ck.array(name + ".scales", ("F16",)).view(np.float16).astype(np.float32)
    return Int4AsymWeight.from_parts(codes, scales, group_size=int(entry["group_size"]))


def _read_int4_k(ck: Checkpoint, name: str, entry: dict):
    from .. import Int4KWeight

    codes = unpack_runs(ck.array(name + ".codes", ("U8",)))
    groups = codes.shape[1] // _RUN
    six = unpack_six(ck.array(name + ".scale_codes", ("U8",)), 2 * groups)
    supers = ck.array(name + ".supers", ("F16",)).view(np.float16).astype(np.float32)
    return Int4KWeight.from_parts(codes, six.reshape(-1, groups, 2), supers)


def _read_int_zp(ck: Checkpoint, name: str, entry: dict):
    from .. import IntZpWeight

    bits = int(entry["bits"])
    codes = ck.array(name + ".codes", ("U8",))
    perm = ck.array(name + ".perm", ("I64",)) if name + ".perm" in ck else None
    return IntZpWeight.from_parts(
        unpack_runs(codes) if bits == 4 else codes,
        ck.array(name + ".scales", ("F16",)).view(np.float16),
        ck.array(name + ".zeros", ("U8",)),
        group_size=int(entry["group_size"]),
        bits=bits,
        perm=perm,
    )


def _read_gguf(ck: Checkpoint, name: str, entry: dict):
    from .. import GgufWeight

    shape = (int(entry["out_feat"]), int(entry["in_feat"]))
    return GgufWeight.from_bytes(str(entry["type"]), shape, ck.array(name + ".blocks", ("U8",)))


_READERS = {
    "int4": _read_int4,
    "int4_asym": _read_int4_asym,
    "int4_k": _read_int4_k,
    "int_zp": _read_int_zp,
    "gguf": _read_gguf,
}
