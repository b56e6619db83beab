"""The end of a file writer whose tensors are all declared up front (safetensors'
``StWriter``, GGUF's ``GgufStreamWriter``): the output is a ``quantrs._core._AtomicFile``
that appears at its path on ``commit()`` only once every declared tensor was written, and
is deleted on ``abort()`` or when the ``with`` block ends without a commit."""

from __future__ import annotations


class DeclaredWriter:
    """Subclasses set ``self._out`` (an ``_AtomicFile``) and ``self._left`` (tensors
    declared but not yet written) and count ``_left`` down in ``write``."""

    _out = None
    _left = 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # An uncommitted file is never left behind, exception or not.
        if self._out is not None:
            self.abort()

    def commit(self) -> None:
        if self._left:
            raise RuntimeError(f"internal error: {self._left} declared tensors were not written")
        out, self._out = self._out, None
        out.commit()

    def abort(self) -> None:
        out, self._out = self._out, None
        if out is not None:
            out.abort()
