"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", arXiv 2210.17323) writing the existing INT4 formats.

For a linear layer ``y = x W^T`` and the Hessian ``H = 2 X^T X`` of its squared output
error over calibration inputs ``X``, the inputs (columns of ``W``) are quantized one at a
time; each column's rounding error, scaled by the Cholesky factor of ``H^-1``, is pushed
onto the columns not yet quantized, so that they compensate for it (the Optimal Brain
Surgeon update). The paper's practical form is followed: dampening of ``damp`` times the
mean diagonal, the upper Cholesky factor of ``H^-1`` computed once, and lazy updates in
blocks of columns (the rest of ``W`` is updated once per block: the paper's B = 128;
here at most 32, which measured faster in NumPy, the result being the same algebra).

Group parameters: each group's scale (``"int4"``) or step and minimum (``"int4_asym"``)
are chosen by the format's own quantizer (``grid``: ``"rtn"``, ``"full"``, ``"search"``)
on the error-updated weights when the group starts, its error weighted by ``diag(H)``
(each input's mean ``x^2``, the importance matrix). With ``act_order`` the columns are
quantized by decreasing ``diag(H)`` and, because the formats have no per-column group
index, every group's parameters are fixed from the original weights first (the
"static groups" variant of the GPTQ reference code). The codes are those the format's
reference rounds to, so the result is an ordinary ``QuantizedWeight`` /
``Int4AsymWeight`` (docs/int4.md "GPTQ").

``refine``: after the sweep, the group parameters are refitted to the codes by least
squares under the whole Hessian (``_gptq_refit``); from the second refit on, a sweep with
the refitted parameters fixed re-chooses the codes before each refit, and each row keeps
the codes and parameters of lower error under the Hessian.
"""

from __future__ import annotations

import numpy as np

from . import _core
from ._gptq_k import KGroups
from ._gptq_refit import better_rows, refit

# Most columns per lazy batch update (the paper uses B = 128).
BLOCK = 32

_FORMATS = ("int4", "int4_asym", "int4_k")


def gptq(
    w: np.ndarray,
    hessian: np.ndarray,
    *,
    format: str = "int4",
    group_size: int = 32,
    grid: str = "search",
    damp: float = 0.01,
    act_order: bool = False,
    refine: int = 1,
) -> _core.QuantizedWeight | _core.Int4AsymWeight | _core.Int4KWeight:
    """Quantize ``w`` (float ``[out, in]``, ``nn.Linear.weight``'s layout) by GPTQ with
    the Hessian ``hessian`` (``[in, in]``, ``2 X^T X`` or any positive multiple of
    ``X^T X`` over calibration inputs ``X [n, in]``). Returns a ``QuantizedWeight``
    (``format="int4"``, its ``[in, out]`` layout) or an ``Int4AsymWeight``
    (``"int4_asym"``, ``[out, in]``) in groups of ``group_size`` inputs, each group's
    parameters chosen by ``grid`` (the format's ``method``); ``refine`` least-squares
    refits of the parameters follow (docs/int4.md "GPTQ"). ``"int4_k"`` gives an
    ``Int4KWeight`` (``[out, in]``, groups of 32, ``group_size`` must stay 32) whose groups
    are fixed by ``grid`` on the original weights and whose codes GPTQ picks; ``refine``
    does not apply to it (``quantrs._gptq_k``)."""
    if format not in _FORMATS:
        raise _core.InvalidArgument(
            f"format: expected 'int4', 'int4_asym' or 'int4_k', got {format!r}"
        )
    if format == "int4_k" and group_size != 32:
        raise _core.InvalidArgument(
            f"group_size: 'int4_k' has groups of 32; leave the default 32, got {group_size!r}"
        )
    w64 = _matrix(w, "w")
    out_feat, in_feat = w64.shape
    h = _matrix(hessian, "hessian")
    if h.shape != (in_feat, in_feat):
        raise _core.InvalidArgument(
            f"hessian: expected shape ({in_feat}, {in_feat}) for w of shape {w64.shape}, "
            f"got {h.shape}"
        )
    if not (isinstance(damp, (int, float)) and 0.0 < damp < 1e6):
        raise _core.InvalidArgument(f"damp: expected a number > 0, got {damp!r}")
    if not (isinstance(refine, int) and not isinstance(refine, bool) and 0 <= refine <= 100):
        raise _core.InvalidArgument(f"refine: expected an integer in 0..100, got {refine!r}")
    diag = np.diag(h)
    if (diag < 0).any():
        raise _core.InvalidArgument(
            f"hessian: diagonal [{int(np.argmax(diag < 0))}] is negative, expected X^T X"
        )
    hd = damped(h, damp)
    how = (format, group_size, grid, act_order, refine)
    return gptq_factored(w64, inverse_cholesky(hd), hd, diag, how)


def gptq_factored(
    w: np.ndarray,
    upper: np.ndarray,
    hd: np.ndarray,
    diag: np.ndarray,
    how: tuple[str, int, str, bool, int],
) -> _core.QuantizedWeight | _core.Int4AsymWeight | _core.Int4KWeight:
    """:func:`gptq` on float64 ``w`` with the dampened Hessian ``hd`` (:func:`damped`),
    its factor (:func:`inverse_cholesky`) and ``diag(H)``: layers that share their inputs
    (q / k / v) share them. ``how``: format, group size, grid, act_order, refine."""
    format, group_size, grid, act_order, refine = how
    order = np.argsort(-diag, kind="stable") if act_order else np.arange(w.shape[1])
    if act_order:
        # The factor of H^-1 in the sweep's order (a permuted factor is not the factor
        # of the permuted matrix), as the reference code permutes H first.
        upper = inverse_cholesky(hd[np.ix_(order, order)])
    if format == "int4_k":
        # Static groups from the search, the codes by the sweep; no refit (see _gptq_k).
        k_groups = KGroups(w, grid, diag)
        return k_groups.assemble(_run(w, upper, order, k_groups, fixed=True))
    grids = _SymGroups if format == "int4" else _AsymGroups
    # Validates w (finite, in range), group_size and grid; act_order's static groups
    # come from the search, natural order's from each group's start (the cheap "rtn"
    # here only checks).
    groups = grids(w, group_size, grid if act_order else "rtn", diag)
    groups.grid = grid
    codes = _run(w, upper, order, groups, fixed=act_order)
    if refine:
        groups.params = refit(w, hd, codes, groups.params, groups.size)
    for _ in range(1, refine):
        kept = (codes, groups.params)
        codes = _run(w, upper, order, groups, fixed=True)
        tried = (codes, refit(w, hd, codes, groups.params, groups.size))
        codes, groups.params = better_rows(w, hd, groups.size, kept, tried)
    return groups.assemble(codes)


def _matrix(a: object, arg: str) -> np.ndarray:
    try:
        m = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{arg}: expected a 2-D float array, got {type(a).__name__}") from e
    if m.ndim != 2 or 0 in m.shape:
        raise _core.InvalidArgument(f"{arg}: expected a non-empty 2-D array, got shape {m.shape}")
    bad = np.argwhere(~np.isfinite(m))
    if len(bad):
        i, j = bad[0]
        raise _core.InvalidArgument(f"{arg}[{i}, {j}] is {m[i, j]}, expected finite")
    return m


def damped(h: np.ndarray, damp: float) -> np.ndarray:
    """``H + damp * mean(diag H) I``, symmetrized; inputs that never carry a value (zero
    diagonal) get 1 there, as in the reference code."""
    h = (h + h.T) / 2
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += damp * float(np.mean(np.diag(h)))
    return h


def inverse_cholesky(hd: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor of ``hd^-1`` (``hd`` from :func:`damped`)."""
    try:
        inv = np.linalg.inv(hd)
        return np.linalg.cholesky((inv + inv.T) / 2).T
    except np.linalg.LinAlgError as e:
        raise _core.InvalidArgument(
            "hessian: expected a positive semi-definite X^T X (Cholesky failed)"
        ) from e


def _run(w: np.ndarray, u: np.ndarray, order: np.ndarray, groups, fixed: bool) -> np.ndarray:
    """The GPTQ sweep over the columns of ``w`` in ``order``; returns the codes
    ``[out, in]`` (input order). ``u`` is the upper Cholesky factor of ``H^-1`` with
    rows and columns in ``order``."""
    w = w[:, order].copy()
    out_feat, in_feat = w.shape
    codes = np.zeros((out_feat, in_feat), np.int8)
    gs = groups.size
    block = _block_size(gs)
    for b0 in range(0, in_feat, block):
        b1 = min(b0 + block, in_feat)
        w1 = w[:, b0:b1]  # a view: updated in place
        err = np.zeros((out_feat, b1 - b0))
        for i in range(b1 - b0):
            col = int(order[b0 + i])
            if not fixed and col % gs == 0:
                # A group starts on a block boundary: every earlier column's update
                # has reached all of its columns.
                groups.choose(col // gs, w[:, col : col + gs])
            q, deq = groups.quantize(col // gs, w1[:, i])
            codes[:, col] = q
            e = (w1[:, i] - deq) / u[b0 + i, b0 + i]
            w1[:, i + 1 :] -= np.outer(e, u[b0 + i, b0 + i + 1 : b1])
            err[:, i] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return codes


def _block_size(gs: int) -> int:
    """Columns per lazy batch: a divisor of the group size (so groups start on block
    boundaries) of at most ``BLOCK``. Small batches keep the per-column update short;
    the rest of ``W`` is updated by one matrix product per batch."""
    block = gs
    while block > BLOCK and block % 2 == 0:
        block //= 2
    return block


class _SymGroups:
    """Symmetric INT4 (``QuantizedWeight``): one float32 scale per group and output,
    codes ``clamp(round_half_even(w / scale), -8, 7)`` (docs/int4.md "The format")."""

    def __init__(self, w: np.ndarray, group_size: int, grid: str, diag: np.ndarray):
        self.out_feat, self.in_feat = w.shape
        self.grid, self.imp = grid, diag.astype(np.float32)
        static = _quantize_sym(w.T, group_size, grid, self.imp)
        self.size = min(group_size, self.in_feat + self.in_feat % 2)
        self.scales = np.array(static.scales).reshape(static.num_groups, self.out_feat)

    @property
    def params(self) -> np.ndarray:
        """The scales as ``[out, groups, 1]`` (``_gptq_refit``'s layout)."""
        return self.scales.T[:, :, None].copy()

    @params.setter
    def params(self, p: np.ndarray) -> None:
        self.scales = np.ascontiguousarray(p[:, :, 0].T, np.float32)

    def choose(self, g: int, cols: np.ndarray) -> None:
        rows = slice(g * self.size, g * self.size + cols.shape[1])
        qw = _quantize_sym(cols.T, self.size, self.grid, self.imp[rows])
        self.scales[g] = np.array(qw.scales)

    def quantize(self, g: int, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = self.scales[g]
        q = np.clip(np.round(col.astype(np.float32) / s), -8, 7).astype(np.int8)
        return q, q.astype(np.float32) * s

    def assemble(self, codes: np.ndarray) -> _core.QuantizedWeight:
        groups = self.scales.shape[0]
        padded = np.zeros((groups * self.size, self.out_feat), np.uint8)
        padded[: self.in_feat] = codes.T.astype(np.uint8) & 0x0F
        data = padded[0::2] | (padded[1::2] << 4)
        return _core.QuantizedWeight(
            data.ravel(), self.scales.ravel(), self.in_feat, self.out_feat, groups
        )


class _AsymGroups:
    """Asymmetric INT4 (``Int4AsymWeight``): a half step ``d`` and minimum ``m`` per group
    and output, codes ``clip(round((w - m) * (1 / d)), 0, 15)`` rounded half away from
    zero in float32, value ``d * q + m`` (docs/int4.md "Asymmetric INT4")."""

    def __init__(self, w: np.ndarray, group_size: int, grid: str, diag: np.ndarray):
        self.out_feat, self.in_feat = w.shape
        self.grid, self.imp, self.size = grid, diag.astype(np.float32), group_size
        static = _quantize_asym(w, group_size, grid, self.imp)
        self.pairs = np.array(static.scales()).transpose(1, 0, 2).copy()  # [groups, out, 2]

    @property
    def params(self) -> np.ndarray:
        """The ``(d, m)`` pairs as ``[out, groups, 2]`` (``_gptq_refit``'s layout)."""
        return self.pairs.transpose(1, 0, 2).copy()

    @params.setter
    def params(self, p: np.ndarray) -> None:
        self.pairs = np.ascontiguousarray(p.transpose(1, 0, 2), np.float32)

    def choose(self, g: int, cols: np.ndarray) -> None:
        rows = slice(g * self.size, g * self.size + cols.shape[1])
        qa = _quantize_asym(cols, self.size, self.grid, self.imp[rows])
        self.pairs[g] = np.array(qa.scales())[:, 0]

    def quantize(self, g: int, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d, m = self.pairs[g, :, 0], self.pairs[g, :, 1]
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        t = (col.astype(np.float32) - m) * inv
        r = np.floor(t)
        r += t - r >= 0.5  # half away from zero (Rust's f32::round); t < 0 clips to 0
        q = np.clip(r, 0, 15).astype(np.int8)
        return q, d * q.astype(np.float32) + m

    def assemble(self, codes: np.ndarray) -> _core.Int4AsymWeight:
        return _core.Int4AsymWeight.from_parts(
            codes.astype(np.uint8), self.pairs.transpose(1, 0, 2), group_size=self.size
        )


def _quantize_sym(w_in_out: np.ndarray, gs: int, grid: str, imp: np.ndarray):
    return _core.QuantizedWeight.quantize(
        np.ascontiguousarray(w_in_out, np.float32), group_size=gs, method=grid, importance=imp
    )


def _quantize_asym(w_out_in: np.ndarray, gs: int, grid: str, imp: np.ndarray):
    return _core.Int4AsymWeight.quantize(
        np.ascontiguousarray(w_out_in, np.float32), group_size=gs, method=grid, importance=imp
    )
