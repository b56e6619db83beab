"""The ``int4_k`` groups of GPTQ (:mod:`quantrs._gptq`): static groups from the
importance-weighted search.

An ``int4_k`` group's step and minimum are not free floats: they are 6-bit codes
``(sc, mn)`` under a half pair ``(D, Dmin)`` shared by the whole super-block
(``w = (D sc) q - Dmin mn``, docs/int4.md "k-quant-style INT4"). Choosing them again at
each group's start would change the super-block's ``(D, Dmin)`` under groups already
swept, and a least-squares refit would leave the 6-bit grid. So every group is fixed up
front by ``Int4KWeight.quantize(method="search")`` on the original weights, its error
weighted by ``diag(H)`` (the importance matrix), and GPTQ then chooses only the codes,
column by column with error feedback (the "static groups" variant of the GPTQ
reference code; docs/int4.md "GPTQ").
"""

from __future__ import annotations

import numpy as np

from . import _core


class KGroups:
    """``int4_k`` groups for the GPTQ sweep: fixed ``(d, m) = (D sc, Dmin mn)`` per group
    of 32 and output, codes ``clip(round((w + m) / d), 0, 15)``, value ``d q - m``."""

    fixed = True  # the sweep never re-chooses a group (see the module docstring)

    def __init__(self, w: np.ndarray, grid: str, diag: np.ndarray):
        static = _core.Int4KWeight.quantize(
            np.ascontiguousarray(w, np.float32), method=grid, importance=diag.astype(np.float32)
        )
        self.size = static.group_size
        self.scale_codes = np.array(static.scale_codes())  # [out, groups, 2]
        self.supers = np.array(static.supers())  # [out, supers, 2], exact halves
        per_super = static.super_block // self.size
        sup = np.repeat(self.supers, per_super, axis=1)  # [out, groups, 2]
        sc = self.scale_codes.astype(np.float32)
        # The products in float32, as the format's dequantizer forms them.
        self.d = (sup[:, :, 0] * sc[:, :, 0]).T.copy()  # [groups, out]
        self.m = (sup[:, :, 1] * sc[:, :, 1]).T.copy()

    def quantize(self, g: int, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d, m = self.d[g].astype(np.float64), self.m[g].astype(np.float64)
        t = np.divide(col + m, d, out=np.zeros_like(col), where=d != 0)
        q = np.clip(np.rint(t), 0, 15).astype(np.int8)
        return q, d * q - m

    def assemble(self, codes: np.ndarray) -> _core.Int4KWeight:
        return _core.Int4KWeight.from_parts(codes.astype(np.uint8), self.scale_codes, self.supers)
