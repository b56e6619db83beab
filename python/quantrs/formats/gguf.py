"""GGUF (version 3) reader (the writer is :mod:`.gguf_write`), written from the format description
(ggml's ``docs/gguf.md``; facts only, no code from gguf-py or llama.cpp).

File layout, all little-endian:

- ``"GGUF"``, ``u32`` version (3), ``u64`` tensor count, ``u64`` key/value count;
- key/value pairs: key (``u64`` length + UTF-8 bytes), ``u32`` value type, value
  (types 0..12: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64; an array is
  ``u32`` element type, ``u64`` count, elements);
- tensor infos: name, ``u32`` n_dims, ``u64`` dims (``ne[0]`` varies fastest: a PyTorch
  ``[out, in]`` weight has ``ne = [in, out]``), ``u32`` ggml type, ``u64`` offset
  relative to the data section (a multiple of the alignment);
- padding to ``general.alignment`` (default 32), then the data section.

``Q4_0``: blocks of 32 consecutive elements of a row, each 18 bytes: an F16 scale
``d``, then 16 bytes whose low nibbles are elements 0..15 and high nibbles elements
16..31; element = ``d * (q - 8)``. That is quantrs INT4 with group 32 exactly (signed
code ``q - 8``, scale ``d`` as float32), whatever the sign of ``d``.

Every size, count and offset is checked against the file size before data is read.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from ._errors import (
    CorruptCheckpointError,
    FormatError,
    TensorNotFoundError,
    UnsupportedFormatError,
)
from ._int4 import from_offset8, requantize
from ._mapped import MappedFile
from .own_layout import unpack_runs

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NESTING = 4

# ggml type id -> (name, elements per block, bytes per block): the ggml type table.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
}
Q4_0 = 2

# value type id -> struct format of a scalar
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufTensor:
    name: str
    dims: tuple[int, ...]  # ne: dims[0] varies fastest
    type_id: int
    offset: int  # absolute file offset
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type_id][0]

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy / PyTorch shape (``dims`` reversed)."""
        return tuple(reversed(self.dims))


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise CorruptCheckpointError(
                f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has {self.size}"
            )
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what + " length")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpointError(f"{what} at offset {self.pos - n} is not UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_NESTING:
                raise CorruptCheckpointError(f"{what}: arrays nested deeper than {MAX_NESTING}")
            etype = self.unpack("<I", what + " element type")
            count = self.unpack("<Q", what + " element count")
            if etype in _SCALARS:
                size = struct.calcsize(_SCALARS[etype])
                raw = self.take(count * size, what)
                return np.frombuffer(raw, np.dtype(_SCALARS[etype])).tolist()
            if etype not in (_STRING, _ARRAY):
                raise CorruptCheckpointError(f"{what}: unknown array element type {etype}")
            if count * 8 > self.size - self.pos:  # every element takes at least 8 bytes
                raise CorruptCheckpointError(f"truncated: {what} claims {count} elements")
            return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise CorruptCheckpointError(f"{what}: unknown value type {vtype}")


class GgufFile(MappedFile):
    """A memory-mapped GGUF file: ``metadata`` (key -> value) and ``tensors`` (name ->
    :class:`GgufTensor`), all validated. Use as a context manager."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size < 24:
                raise CorruptCheckpointError(
                    f"{self.path}: {size} bytes, too short for a GGUF header"
                )
            self._map_whole_file(size)
            self._parse(size)
        except FormatError as e:
            self.close()
            if str(e).startswith(str(self.path)):
                raise
            raise type(e)(f"{self.path}: not a valid GGUF file: {e}") from None
        except BaseException:
            self.close()
            raise

    def _parse(self, size: int) -> None:
        c = _Cursor(self._map, size)
        if c.take(4, "magic") != MAGIC:
            raise CorruptCheckpointError("bad magic (expected 'GGUF')")
        version = c.unpack("<I", "version")
        if version != VERSION:
            raise UnsupportedFormatError(f"version {version}, only version {VERSION} is read")
        n_tensors = c.unpack("<Q", "tensor count")
        n_kv = c.unpack("<Q", "key/value count")
        if n_tensors > size // 8 or n_kv > size // 8:
            raise CorruptCheckpointError(
                f"{n_tensors} tensors / {n_kv} keys cannot fit {size} bytes"
            )
        self.metadata: dict[str, object] = {}
        for i in range(n_kv):
            key = c.string(f"key {i}")
            vtype = c.unpack("<I", f"type of {key!r}")
            self.metadata[key] = c.value(vtype, f"value of {key!r}")
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(align) is not int or align <= 0 or align & (align - 1):
            raise CorruptCheckpointError(f"general.alignment {align!r} is not a power of two")
        self.alignment = align
        infos = []
        for i in range(n_tensors):
            name = c.string(f"name of tensor {i}")
            n_dims = c.unpack("<I", f"n_dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise CorruptCheckpointError(
                    f"tensor {name!r}: {n_dims} dimensions (1..{MAX_DIMS})"
                )
            dims = tuple(c.unpack("<Q", f"dims of {name!r}") for _ in range(n_dims))
            type_id = c.unpack("<I", f"type of {name!r}")
            offset = c.unpack("<Q", f"offset of {name!r}")
            infos.append((name, dims, type_id, offset))
        data_start = -(-c.pos // align) * align
        self.tensors: dict[str, GgufTensor] = {}
        for name, dims, type_id, offset in infos:
            if name in self.tensors:
                raise CorruptCheckpointError(f"tensor {name!r} appears twice")
            if type_id not in GGML_TYPES:
                raise CorruptCheckpointError(f"tensor {name!r}: unknown ggml type {type_id}")
            tname, block, bsize = GGML_TYPES[type_id]
            if 0 in dims:
                # nothing to read, and NumPy cannot shape ``(0, 2**64 - 1)``
                raise CorruptCheckpointError(
                    f"tensor {name!r}: a zero dimension in ne {list(dims)}"
                )
            if dims[0] % block:
                raise CorruptCheckpointError(
                    f"tensor {name!r}: {tname} needs rows of whole {block}-element blocks, "
                    f"ne[0] is {dims[0]}"
                )
            numel = 1
            for d in dims:
                numel *= d
            nbytes = numel // block * bsize
            if offset % align:
                raise CorruptCheckpointError(
                    f"tensor {name!r}: offset {offset} is not a multiple of {align}"
                )
            if data_start + offset + nbytes > size:
                raise CorruptCheckpointError(
                    f"tensor {name!r}: {tname} {list(dims)} needs bytes up to "
                    f"{data_start + offset + nbytes}, the file has {size} (truncated)"
                )
            self.tensors[name] = GgufTensor(name, dims, type_id, data_start + offset, nbytes)
        end = data_start
        for t in sorted(self.tensors.values(), key=lambda t: t.offset):
            if t.offset < end:
                raise CorruptCheckpointError(
                    f"tensor {t.name!r}: data overlaps the previous tensor"
                )
            end = t.offset + t.nbytes

    def raw(self, t: GgufTensor) -> np.ndarray:
        """Read-only uint8 view of the tensor's bytes."""
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.offset)

    def tensor(self, name: str) -> GgufTensor:
        if name not in self.tensors:
            raise TensorNotFoundError(f"{self.path}: no tensor {name!r}")
        return self.tensors[name]

    def dequantize(self, t: GgufTensor) -> np.ndarray:
        """Float32 values with the NumPy shape, for the types quantrs decodes (F32, F16,
        BF16, Q4_0, Q4_1, Q8_0); others raise :class:`FormatError`."""
        raw = self.raw(t)
        rows = raw.reshape(int(np.prod(t.dims[1:], dtype=np.int64)), -1)  # one per ne[0] row
        name = t.type_name
        if name == "F32":
            out = raw.view("<f4").astype(np.float32)
        elif name == "F16":
            out = raw.view("<f2").astype(np.float32)
        elif name == "BF16":
            out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif name in ("Q4_0", "Q4_1", "Q8_0"):
            with np.errstate(invalid="ignore", over="ignore"):  # a non-finite scale: inf * 0
                out = _decode_blocks(name, rows).reshape(-1)
        else:
            raise UnsupportedFormatError(f"tensor {t.name!r}: no decoder for ggml type {name}")
        return out.reshape(t.shape)


def _decode_blocks(name: str, rows: np.ndarray) -> np.ndarray:
    bsize = GGML_TYPES[{"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}[name]][2]
    b = rows.reshape(rows.shape[0], -1, bsize)
    d = b[..., 0:2].copy().view("<f2").astype(np.float32)  # [rows, blocks, 1]
    if name == "Q8_0":
        return (d * b[..., 2:].view(np.int8).astype(np.float32)).reshape(rows.shape[0], -1)
    qs = b[..., 4:] if name == "Q4_1" else b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)  # elements 0..31
    if name == "Q4_1":  # d * q + m
        m = b[..., 2:4].copy().view("<f2").astype(np.float32)
        return (d * q + m).reshape(rows.shape[0], -1)
    return (d * (q - 8)).reshape(rows.shape[0], -1)


# The ggml block types kept packed as :class:`quantrs.GgufWeight` (exact, no float copy).
PACKED_TYPES = frozenset({"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"})


def packed_weight(g: GgufFile, t: GgufTensor):
    """The 2-D block tensor ``t`` (``ne = [in, out]``) as a :class:`quantrs.GgufWeight`
    ``[out, in]``: its bytes read from the memory map and copied once, exactly. A
    truncated tensor or a non-finite block scale raises :class:`CorruptCheckpointError`
    naming the tensor."""
    from .. import GgufWeight, QuantError

    if t.type_name not in PACKED_TYPES:
        raise UnsupportedFormatError(
            f"tensor {t.name!r}: ggml type {t.type_name} is not one of {sorted(PACKED_TYPES)}"
        )
    if len(t.dims) != 2:
        raise UnsupportedFormatError(f"tensor {t.name!r}: {len(t.dims)}-D; a linear weight is 2-D")
    try:
        return GgufWeight.from_bytes(t.type_name.lower(), t.shape, g.raw(t))
    except QuantError as e:  # the file's fault, not the caller's
        raise CorruptCheckpointError(f"{g.path}: tensor {t.name!r}: {e}") from None


def load_gguf_packed(path: str | os.PathLike, name: str):
    """The 2-D block tensor ``name`` of a GGUF file (:data:`PACKED_TYPES`) as a
    :class:`quantrs.GgufWeight`, exact: ``w.matmul(x)`` is ``x @ W.T``."""
    with GgufFile(path) as g:
        return packed_weight(g, g.tensor(name))


def q4_0_to_quantrs(g: GgufFile, t: GgufTensor):
    """The ``QuantizedWeight`` of a 2-D ``Q4_0`` tensor ``[out, in]`` (``ne = [in,
    out]``), exactly: signed code ``q - 8``, scale ``d`` as float32, group 32."""
    from .. import QuantError

    in_feat, out_feat = t.dims
    blocks = g.raw(t).reshape(out_feat, in_feat // 32, 18)
    d = blocks[..., 0:2].copy().view("<f2").astype(np.float32)[..., 0]  # [out, groups]
    qs = blocks[..., 2:]  # [out, groups, 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out_feat, in_feat)
    try:
        return from_offset8(np.ascontiguousarray(q.T), np.ascontiguousarray(d.T), 32, t.name)
    except QuantError as e:  # a non-finite scale, ...: the file's fault, not the caller's
        raise CorruptCheckpointError(f"{g.path}: tensor {t.name!r}: {e}") from None


def q4_1_to_asym(g: GgufFile, t: GgufTensor):
    """The ``Int4AsymWeight`` ``[out, in]`` of a 2-D ``Q4_1`` tensor, exactly (see
    :func:`q4_1_blocks_to_asym`)."""
    from .. import QuantError

    in_feat, out_feat = t.dims
    try:
        return q4_1_blocks_to_asym(g.raw(t), out_feat, in_feat)
    except QuantError as e:  # a non-finite half: the file's fault, not the caller's
        raise CorruptCheckpointError(f"{g.path}: tensor {t.name!r}: {e}") from None


def q4_1_blocks_to_asym(raw: np.ndarray, out_feat: int, in_feat: int):
    """The ``Int4AsymWeight`` ``[out, in]`` of ``Q4_1`` blocks (uint8, ``out * in / 32 *
    20`` bytes), exactly: a ``Q4_1`` block (F16 ``d``, F16 ``m``, 16 bytes of codes,
    element ``j`` low and ``j + 16`` high) is an ``int4_asym`` group of 32 with the same
    ``w = d * q + m`` (docs/int4.md)."""
    from .. import Int4AsymWeight

    blocks = np.asarray(raw, np.uint8).reshape(out_feat, in_feat // 32, 20)
    dm = blocks[..., 0:4].copy().view("<f2").astype(np.float32)  # [out, groups, 2]
    codes = unpack_runs(np.ascontiguousarray(blocks[..., 4:]).reshape(out_feat, in_feat // 2))
    return Int4AsymWeight.from_parts(codes, dm, group_size=32)


def exact_packed(g: GgufFile, t: GgufTensor):
    """The 2-D block tensor ``t`` in the quantrs type that holds it exactly with the
    fewest changes: ``Q4_0`` a ``QuantizedWeight`` (INT4 group 32, ``[in, out]``),
    ``Q4_1`` an ``Int4AsymWeight`` (group 32), every other :data:`PACKED_TYPES` type a
    ``GgufWeight`` over the file's blocks."""
    if t.type_id == Q4_0:
        return q4_0_to_quantrs(g, t)
    if t.type_name == "Q4_1":
        return q4_1_to_asym(g, t)
    return packed_weight(g, t)


def read_gguf_weight(g: GgufFile, name: str, requantize_ok: bool = False):
    """``(QuantizedWeight, error or None, note)`` for the 2-D tensor ``name``."""
    t = g.tensor(name)
    if len(t.dims) != 2:
        raise UnsupportedFormatError(f"tensor {name!r}: {len(t.dims)}-D; a linear weight is 2-D")
    if t.type_id == Q4_0:
        return q4_0_to_quantrs(g, t), None, ""
    reason = f"ggml type {t.type_name} is not Q4_0"
    if not requantize_ok:
        raise UnsupportedFormatError(
            f"tensor {name!r}: {reason}: not representable in quantrs INT4 exactly (pass "
            "requantize=True / --requantize to dequantize and re-quantize it)"
        )
    w = g.dequantize(t)  # [out, in]
    qw, err = requantize(np.ascontiguousarray(w.T), 32, f"tensor {name!r}", reason)
    return qw, err, reason


def load_gguf(path: str | os.PathLike, name: str, requantize: bool = False):
    """The 2-D tensor ``name`` of a GGUF file as a ``QuantizedWeight`` (``[in, out]``,
    so ``matmul(x)`` computes ``x @ W.T`` for the file's ``W [out, in]``). ``Q4_0`` is
    exact; other types are refused, or with ``requantize=True`` (F32, F16, BF16, Q4_1,
    Q8_0) dequantized and re-quantized with a :class:`RequantizedWarning`."""
    with GgufFile(path) as g:
        return read_gguf_weight(g, name, requantize)[0]
