"""``quantrs.foreign_threads``: cap other libraries' thread pools around a decode loop.

After a multi-threaded call, NumPy's OpenBLAS keeps its worker threads spinning for about
0.1 s, and an OpenMP pool (torch's) for its own spin time. A batch-1 quantrs kernel that
follows shares its cores with those spinners (docs/int4.md, "Threads"). Neither library can
shorten the spin once it is loaded (OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT`` once), but both
accept a thread count at run time: with one thread they run on the calling thread and wake no
worker, so nothing is left spinning. threadpoolctl finds the pools in the process (every BLAS
and OpenMP library it knows) and sets that count; this module only scopes it.
"""

from __future__ import annotations

from typing import Any

from ._core import InvalidArgument


class foreign_threads:  # noqa: N801 (named like a function, as ``quantrs.threads``)
    """Cap the BLAS and OpenMP thread pools of this process at ``n`` threads (default 1).

    Applies at once, process-wide; as a context manager (``with quantrs.foreign_threads():``)
    the previous counts come back on exit, and ``.restore()`` does the same without ``with``.
    Results do not change: the libraries compute the same on fewer threads. ``user_api``
    picks the pools: ``None`` (both), ``"blas"`` or ``"openmp"`` (torch's intra-op pool)."""

    def __init__(self, n: int = 1, *, user_api: str | None = None) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"foreign_threads: n: expected an int >= 1, got {type(n).__name__}")
        if n < 1:
            raise InvalidArgument(f"foreign_threads: n: expected >= 1, got {n}")
        if user_api not in (None, "blas", "openmp"):
            raise InvalidArgument(
                f"foreign_threads: user_api: expected None, 'blas' or 'openmp', got {user_api!r}"
            )
        from threadpoolctl import threadpool_limits

        self.n = n
        self._limits: Any = threadpool_limits(limits=n, user_api=user_api)

    def restore(self) -> None:
        """Give every capped pool its thread count from before the cap."""
        self._limits.restore_original_limits()

    def __enter__(self) -> foreign_threads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"quantrs.foreign_threads({self.n})"
