"""A whole GGUF file written from another one: the input's key/value pairs kept as their
bytes (or replaced), each tensor copied or given new bytes, streamed in the order the
header lists them. The layout is GGUF version 3 (:mod:`.gguf`, from ggml's
``docs/gguf.md``): the tensor infos give each tensor's offset in the data section, a
multiple of ``general.alignment`` (32 when absent), and the data section starts at the
first multiple of it after the header. Every size is known before the first byte is
written, so nothing is buffered; the file goes to a temporary sibling that is renamed over
the destination only when every tensor is written (``quantrs._core._AtomicFile``,
docs/security.md "Writing files").

Used by ``quantrs quantize IN.gguf OUT.gguf`` (:mod:`quantrs.cli._quantize_gguf`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._declared_writer import DeclaredWriter
from .gguf import _ARRAY, GGML_TYPES, MAGIC, VERSION, GgufFile, _Cursor

_U32 = 4  # GGUF value type id of a uint32


def kv_records(g: GgufFile) -> list[tuple[str, bytes]]:
    """Each key/value pair of ``g`` as ``(key, bytes)``, the bytes exactly as the file
    holds them (key, value type, value), in file order. ``GgufFile`` has validated the
    header, so this second walk over it cannot fail."""
    buf = g._map
    c = _Cursor(buf, len(buf))
    c.take(4 + 4 + 8, "header")
    n_kv = c.unpack("<Q", "key/value count")
    out = []
    for i in range(n_kv):
        start = c.pos
        key = c.string(f"key {i}")
        vtype = c.unpack("<I", f"type of {key!r}")
        _skip_value(c, vtype, key)
        out.append((key, bytes(buf[start : c.pos])))
    return out


def _skip_value(c: _Cursor, vtype: int, key: str) -> None:
    # arrays of scalars are stepped over without decoding (a vocabulary's scores are
    # large); strings and nested arrays go through the reader's own parser
    if vtype == _ARRAY:
        etype = struct.unpack("<I", c.buf[c.pos : c.pos + 4])[0]
        size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}.get(etype)
        if size is not None:
            count = struct.unpack("<Q", c.buf[c.pos + 4 : c.pos + 12])[0]
            c.take(12 + count * size, f"value of {key!r}")
            return
    c.value(vtype, f"value of {key!r}")


def kv_u32(key: str, value: int) -> bytes:
    """The bytes of the key/value pair ``key = value`` as a uint32."""
    k = key.encode("utf-8")
    return struct.pack("<Q", len(k)) + k + struct.pack("<II", _U32, value)


@dataclass(frozen=True)
class TensorOut:
    """One tensor of the new file: its name, ``dims`` (``ne``, ``dims[0]`` varies
    fastest), ggml type id, and byte count (checked against the type's blocks)."""

    name: str
    dims: tuple[int, ...]
    type_id: int

    @property
    def nbytes(self) -> int:
        _, block, bsize = GGML_TYPES[self.type_id]
        numel = int(np.prod(self.dims, dtype=np.int64))
        return numel // block * bsize


class GgufStreamWriter(DeclaredWriter):
    """Write a GGUF file whose key/values and tensors are all declared up front.

    ``write(name, data)`` must then be called in declaration order with exactly the
    tensor's bytes; ``commit()`` fsyncs and renames the temporary file over ``path``;
    ``abort()`` (or leaving the ``with`` block on an exception) deletes it, so a failed
    run leaves no output behind and an existing file untouched."""

    def __init__(
        self,
        path: str | os.PathLike,
        kvs: Iterable[bytes],
        tensors: list[TensorOut],
        alignment: int,
    ):
        from .._core import InvalidArgument, _AtomicFile

        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidArgument(f"alignment: expected a power of two, got {alignment}")
        kvs = list(kvs)
        self.alignment = alignment
        head = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(tensors), len(kvs)))
        for kv in kvs:
            head += kv
        offset = 0
        for t in tensors:
            _, block, _ = GGML_TYPES[t.type_id]
            if not t.dims or t.dims[0] % block:
                raise InvalidArgument(
                    f"tensor {t.name!r}: ne {list(t.dims)} is not whole blocks of {block}"
                )
            n = t.name.encode("utf-8")
            head += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(t.dims))
            head += struct.pack(f"<{len(t.dims)}Q", *t.dims)
            head += struct.pack("<IQ", t.type_id, offset)
            offset += _padded(t.nbytes, alignment)
        head += b"\0" * (-len(head) % alignment)
        self._pending = iter(tensors)
        self._left = len(tensors)
        self._out = _AtomicFile(Path(path))
        try:
            self._out.write(np.frombuffer(bytes(head), np.uint8))
        except BaseException:
            self.abort()
            raise

    def write(self, name: str, data: np.ndarray | Iterable[np.ndarray]) -> None:
        """Write the next declared tensor: one uint8 array, or an iterable of
        consecutive chunks of its bytes, then the padding to the alignment."""
        chunks = [data] if isinstance(data, np.ndarray) else data
        t = next(self._pending, None)
        if t is None or t.name != name:
            raise RuntimeError(f"internal error: wrote {name!r}, expected {t and t.name!r}")
        written = 0
        for chunk in chunks:
            a = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
            self._out.write(a)
            written += a.nbytes
        if written != t.nbytes:
            raise RuntimeError(f"internal error: {name!r} has {written} bytes, declared {t.nbytes}")
        pad = -written % self.alignment
        if pad:
            self._out.write(np.zeros(pad, np.uint8))
        self._left -= 1


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
