"""What the memory-mapped readers (safetensors, GGUF) share: the open file, its map, and
closing both, also as a context manager."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import TypeVar

_Reader = TypeVar("_Reader", bound="MappedFile")


class MappedFile:
    """``path`` opened for reading; ``_map_whole_file`` maps it read-only."""

    _map: mmap.mmap | None = None

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._file = open(self.path, "rb")  # noqa: SIM115 (closed in close())

    def _map_whole_file(self, size: int) -> None:
        # mmap cannot map an empty file
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def __enter__(self: _Reader) -> _Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive; the GC closes it later
                pass
        self._file.close()
