"""``quantrs inspect FILE.gguf``: each tensor's ggml type, PyTorch shape and bytes, and
how quantrs runs it (docs/formats.md). Reads only the header."""

from __future__ import annotations

import os

from ..formats import FormatError
from ..formats.gguf import PACKED_TYPES, Q4_0, GgufFile
from ._errors import CliError


def is_gguf(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _kind(t) -> str:
    if t.type_id == Q4_0 and len(t.dims) == 2:
        return "gguf q4_0: exact quantrs int4 g32, or packed GgufWeight"
    if t.type_name == "Q4_1" and len(t.dims) == 2:
        return "gguf q4_1: exact quantrs int4_asym g32, or packed GgufWeight"
    if t.type_name in PACKED_TYPES and len(t.dims) == 2:
        return f"gguf {t.type_name.lower()}: packed GgufWeight"
    return "-"


def inspect_gguf(path: str | os.PathLike) -> dict:
    """``{"path", "file_bytes", "metadata", "tensors": [{name, dtype, shape, bytes, kind}]}``."""
    try:
        g = GgufFile(path)
    except FormatError as e:
        raise CliError(str(e)) from None
    with g:
        tensors = [
            {
                "name": t.name,
                "dtype": t.type_name,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "kind": _kind(t),
            }
            for t in g.tensors.values()
        ]
    return {
        "path": str(path),
        "file_bytes": os.path.getsize(path),
        "quantrs_format": None,
        "metadata": {},
        "tensors": tensors,
    }
