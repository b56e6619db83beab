"""Streaming safetensors reader and writer, NumPy and the standard library only.

The format (https://github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian ``u64`` header length ``N``; ``N`` bytes of UTF-8 JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets
relative to the end of the header), plus an optional ``"__metadata__"`` map of
strings; then the raw little-endian tensor bytes, packed without holes.

Why not ``safetensors.safe_open``: its NumPy backend cannot hand out BF16 or FP8
tensors, and ``quantize`` must copy those through untouched. This reader
memory-maps the file and gives each tensor as a read-only view of the map, so
nothing is read until it is touched, and :meth:`StReader.release` drops the pages
of a tensor once it has been processed (the peak stays near one tensor, not the
file). The writer computes every offset up front from the known output sizes and
then streams the tensors in order into a temporary file that is renamed over the
destination only when everything has been written.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._core import InvalidArgument, _AtomicFile
from ._declared_writer import DeclaredWriter
from ._errors import CorruptCheckpointError
from ._mapped import MappedFile

# safetensors dtype name -> (NumPy dtype for a view, bytes per element).
# F8 and BF16 have no portable NumPy dtype: they are viewed as their raw codes.
DTYPES: dict[str, tuple[np.dtype, int]] = {
    "BOOL": (np.dtype("?"), 1),
    "U8": (np.dtype("u1"), 1),
    "I8": (np.dtype("i1"), 1),
    "F8_E4M3": (np.dtype("u1"), 1),
    "F8_E5M2": (np.dtype("u1"), 1),
    "I16": (np.dtype("<i2"), 2),
    "U16": (np.dtype("<u2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I32": (np.dtype("<i4"), 4),
    "U32": (np.dtype("<u4"), 4),
    "F32": (np.dtype("<f4"), 4),
    "I64": (np.dtype("<i8"), 8),
    "U64": (np.dtype("<u8"), 8),
    "F64": (np.dtype("<f8"), 8),
}
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
_ALIGN = 8  # pad the header so tensor data starts 8-byte aligned


class StFormatError(CorruptCheckpointError):
    """The file is not a valid safetensors file (message names the problem); callers
    re-raise it with the path."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _parse_header(raw: bytes, data_start: int, file_size: int) -> tuple[list[TensorInfo], dict]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise StFormatError("header is not valid JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise StFormatError(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise StFormatError("header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise StFormatError("__metadata__ must map strings to strings")
    infos = []
    for name, entry in header.items():
        try:
            dtype, shape, (b, e) = entry["dtype"], entry["shape"], entry["data_offsets"]
            shape = tuple(shape)
        except (KeyError, TypeError, ValueError):
            raise StFormatError(f"tensor {name!r}: malformed header entry") from None
        if not all(type(v) is int for v in (*shape, b, e)):  # bool and float are not
            raise StFormatError(f"tensor {name!r}: shape and offsets must be integers")
        if dtype not in DTYPES:
            raise StFormatError(f"tensor {name!r}: unsupported dtype {dtype!r}")
        if any(d < 0 for d in shape) or not 0 <= b <= e:
            raise StFormatError(f"tensor {name!r}: negative shape or offsets")
        want = int(np.prod(shape, dtype=object)) * DTYPES[dtype][1]
        if e - b != want:
            raise StFormatError(
                f"tensor {name!r}: {dtype} {list(shape)} needs {want} bytes, offsets give {e - b}"
            )
        infos.append(TensorInfo(name, dtype, shape, data_start + b, e - b))
    # Tensors must tile the data area exactly (what the safetensors library checks too).
    pos = data_start
    for t in sorted(infos, key=lambda t: (t.begin, t.nbytes)):
        if t.begin != pos:
            raise StFormatError(f"tensor {t.name!r}: data offsets overlap or leave a hole")
        pos += t.nbytes
    if pos != file_size:
        raise StFormatError(
            f"file is {file_size} bytes but the header describes {pos} "
            f"({'truncated' if pos > file_size else 'trailing bytes'})"
        )
    return infos, meta


class StReader(MappedFile):
    """A memory-mapped safetensors file. Use as a context manager."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        try:
            size = os.fstat(self._file.fileno()).st_size
            head = self._file.read(8)
            if len(head) < 8:
                raise StFormatError(f"file is {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise StFormatError(f"header length {n} does not fit a {size}-byte file")
            raw = self._file.read(n)
            self.tensors, self.metadata = _parse_header(raw, 8 + n, size)
            self._map_whole_file(size)
        except BaseException:
            self._file.close()
            raise
        self.by_name = {t.name: t for t in self.tensors}

    def in_file_order(self) -> list[TensorInfo]:
        return sorted(self.tensors, key=lambda t: t.begin)

    def raw(self, t: TensorInfo) -> np.ndarray:
        """Read-only view of the tensor's bytes (uint8), nothing read yet."""
        if t.nbytes == 0:
            return np.empty(0, np.uint8)
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.begin)

    def array(self, t: TensorInfo) -> np.ndarray:
        """Read-only view with the tensor's shape (BF16/F8 as their raw codes)."""
        return self.raw(t).view(DTYPES[t.dtype][0]).reshape(t.shape)

    def as_float32(self, t: TensorInfo) -> np.ndarray:
        """The tensor as float32: a view for F32, a new array for F16/BF16/F64."""
        a = self.array(t)
        if t.dtype == "F32":
            return a
        if t.dtype == "BF16":  # bfloat16 is the top half of a float32
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32)

    def release(self, t: TensorInfo, start: int = 0, length: int | None = None) -> None:
        """Drop the resident pages of bytes ``[start, start + length)`` of a tensor
        (all of it by default) from this process; they are re-read if touched again."""
        if length is None:
            length = t.nbytes - start
        if self._map is None or length <= 0 or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        lo = (t.begin + start) // page * page
        hi = min(-(-(t.begin + start + length) // page) * page, len(self._map))
        self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


@dataclass(frozen=True)
class OutSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[self.dtype][1]


class StWriter(DeclaredWriter):
    """Write a safetensors file whose tensors are all declared up front.

    ``write(name, array)`` must then be called in declaration order; each array's
    bytes must match its declared size. ``commit()`` fsyncs and renames the
    temporary file over ``path``; ``abort()`` (or leaving the ``with`` block on an
    exception) deletes it, so a failed run leaves no output file behind.
    """

    def __init__(self, path: str | os.PathLike, specs: list[OutSpec], metadata: dict[str, str]):
        self.path = Path(path)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise InvalidArgument(f"specs: output tensor name {dup!r} would be written twice")
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = metadata
        offset = 0
        for s in specs:
            header[s.name] = {
                "dtype": s.dtype,
                "shape": list(s.shape),
                "data_offsets": [offset, offset + s.nbytes],
            }
            offset += s.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-(8 + len(raw)) % _ALIGN)
        self._pending: Iterator[OutSpec] = iter(specs)
        self._left = len(specs)
        self._out: _AtomicFile | None = _AtomicFile(self.path)
        try:
            self._out.write(np.frombuffer(struct.pack("<Q", len(raw)) + raw, np.uint8))
        except BaseException:
            self.abort()
            raise

    def write(self, name: str, data: np.ndarray | Iterable[np.ndarray]) -> None:
        """Write the next declared tensor: one array, or an iterable of consecutive
        chunks of its bytes (C order, little-endian), consumed lazily."""
        chunks = [data] if isinstance(data, np.ndarray) else data
        spec = next(self._pending, None)
        if spec is None or spec.name != name:
            raise RuntimeError(f"internal error: wrote {name!r}, expected {spec and spec.name!r}")
        written = 0
        for chunk in chunks:
            a = np.ascontiguousarray(chunk)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            self._out.write(a.reshape(-1).view(np.uint8))
            written += a.nbytes
        if written != spec.nbytes:
            raise RuntimeError(
                f"internal error: {name!r} has {written} bytes, declared {spec.nbytes}"
            )
        self._left -= 1
