"""Per-tensor conversions of ``quantrs quantize``, each bounded in memory.

The row formats (``int4_asym``, ``int4_k``, the ggml types): one float32 copy of ``W [out,
in]``, quantized, the error computed a band of rows at a time. INT4: ``W [out, in]`` is
transposed in tiles into a float32 ``[in, out]`` copy (the one full-size buffer), handed
to ``QuantizedWeight.quantize``, and the error report is computed from the packed bytes,
chunk by chunk. FP8: encoded in row blocks straight from the memory map. Errors: relative
Frobenius ``||W - deq|| / ||W||`` and the largest absolute error.
"""

from __future__ import annotations

import numpy as np

from .._core import InvalidArgument
from ..formats._stfile import StReader, TensorInfo

_CHUNK = 16 << 20  # bytes per streamed chunk (copies, transposition)
_ERR_ELEMS = 1 << 20  # elements per chunk of the error report (a few float64 temporaries)


def _transposed_f32(reader: StReader, t: TensorInfo) -> np.ndarray:
    """``W.T`` as a new C-contiguous float32 array, copied in 64 x 512 tiles (cache
    friendly) from row blocks whose source pages are dropped once copied (peak: one
    float32 copy of the tensor)."""
    out_feat, in_feat = t.shape
    wt = np.empty((in_feat, out_feat), np.float32)
    src = reader.array(t)
    row_bytes = t.nbytes // out_feat
    step = max(1, min(64, _CHUNK // row_bytes))
    for r0 in range(0, out_feat, step):
        r1 = min(out_feat, r0 + step)
        for c0 in range(0, in_feat, 512):
            tile = src[r0:r1, c0 : c0 + 512]
            if t.dtype == "BF16":  # bfloat16 is the top half of a float32
                tile = (tile.astype(np.uint32) << 16).view(np.float32)
            wt[c0 : c0 + 512, r0:r1] = tile.T  # F16/F64 are cast on assignment
        reader.release(t, r0 * row_bytes, (r1 - r0) * row_bytes)
    return wt


def int4_tensor(reader: StReader, t: TensorInfo, meta: dict, group_size: int, method="rtn",
                prepared=(None, None)):  # fmt: skip
    """``[qweight [num_pairs, out] u8, scales [num_groups, out] f32]`` and the error;
    ``prepared``: ``(importance or None, the QuantizedWeight GPTQ made or None)``."""
    from .. import QuantizedWeight

    wt = _transposed_f32(reader, t)
    importance, qw = prepared
    if qw is None:
        qw = QuantizedWeight.quantize(
            wt, group_size=group_size, method=method, importance=importance
        )
    m = meta
    data = np.asarray(qw.data).reshape(-1, m["out_feat"])
    scales = np.asarray(qw.scales).reshape(-1, m["out_feat"])
    if (qw.in_feat, qw.out_feat, qw.num_groups) != (m["in_feat"], m["out_feat"], m["num_groups"]):
        raise RuntimeError(f"internal error: unexpected INT4 layout for {t.name!r}")
    err = _int4_error(wt, data, scales, m["group_size"])
    return [data, scales], err


def _int4_error(wt: np.ndarray, data: np.ndarray, scales: np.ndarray, gs: int):
    """Relative Frobenius and max-abs error of the packed weight against ``wt``,
    dequantized in NumPy chunk by chunk (never a full float32 copy)."""
    in_feat = wt.shape[0]
    acc = _ErrAcc()
    step = max(1, _ERR_ELEMS // (2 * wt.shape[1]))  # pairs per chunk
    for p0 in range(0, data.shape[0], step):
        b = data[p0 : p0 + step]
        q = np.empty((2 * b.shape[0], b.shape[1]), np.int8)
        q[0::2] = (b << 4).view(np.int8) >> 4  # low nibble, sign-extended
        q[1::2] = b.view(np.int8) >> 4  # high nibble, sign-extended
        r0 = 2 * p0
        g = np.arange(r0, r0 + q.shape[0]) // gs
        deq = q.astype(np.float32) * scales[g]
        n = min(q.shape[0], in_feat - r0)
        acc.add(wt[r0 : r0 + n], deq[:n])
    return acc.result()


def _rows_f32(reader: StReader, t: TensorInfo) -> np.ndarray:
    """``W [out, in]`` as a new float32 array, converted row block by row block (the
    source pages dropped once copied)."""
    w = np.empty(t.shape, np.float32)
    src = reader.array(t)
    row_bytes = t.nbytes // t.shape[0]
    step = max(1, _CHUNK // row_bytes)
    for r0 in range(0, t.shape[0], step):
        block = src[r0 : r0 + step]
        if t.dtype == "BF16":  # bfloat16 is the top half of a float32
            block = (block.astype(np.uint32) << 16).view(np.float32)
        w[r0 : r0 + step] = block
        reader.release(t, r0 * row_bytes, min(step, t.shape[0] - r0) * row_bytes)
    return w


def asym_tensor(reader: StReader, t: TensorInfo, group_size: int, method="search",
                prepared=(None, None)):  # fmt: skip
    """The ``int4_asym`` tensors of :func:`quantrs.formats.own_layout.own_outputs` and
    the error; ``prepared`` as for :func:`int4_tensor` (an ``Int4AsymWeight``)."""
    from .. import Int4AsymWeight

    def quantize(w, importance):
        return Int4AsymWeight.quantize(
            w, group_size=group_size, method=method, importance=importance
        )

    return _rows_tensor(reader, t, quantize, prepared)


def k_tensor(reader: StReader, t: TensorInfo, method="search", prepared=(None, None)):
    """The ``int4_k`` tensors of :func:`quantrs.formats.own_layout.own_outputs` and the
    error; ``prepared`` as for :func:`int4_tensor` (an ``Int4KWeight``)."""
    from .. import Int4KWeight

    def quantize(w, importance):
        return Int4KWeight.quantize(w, method=method, importance=importance)

    return _rows_tensor(reader, t, quantize, prepared)


def gguf_tensor(reader: StReader, t: TensorInfo, gtype: str, prepared=(None, None)):
    """The ``gguf`` tensor (``<name>.blocks``, ggml type ``gtype``) of
    :func:`quantrs.formats.own_layout.own_outputs` and the error: ``GgufWeight.quantize``,
    llama.cpp's quantizer, weighted by the importance ``prepared`` holds."""
    from .. import GgufWeight

    def quantize(w, importance):
        return GgufWeight.quantize(w, gtype, importance=importance)

    return _rows_tensor(reader, t, quantize, prepared)


def _rows_tensor(reader: StReader, t: TensorInfo, quantize, prepared):
    """A weight packed ``[out, in]`` (``quantize(w, importance)``, or the one
    ``prepared`` holds): its tensors and the error, checked a band of rows at a time."""
    from ..formats.own_layout import own_arrays

    packed, err = quantize_rows(_rows_f32(reader, t), quantize, prepared)
    return own_arrays(packed), err


def quantize_rows(w: np.ndarray, quantize, prepared=(None, None)):
    """``(packed, error)`` of the float32 weight ``w [out, in]``: ``quantize(w,
    importance)`` (or the weight ``prepared`` holds), the error checked a band of rows at
    a time. A non-finite weight raises ``InvalidArgument`` naming the index."""
    if not np.isfinite(w).all():
        r, c = np.argwhere(~np.isfinite(w))[0]
        raise InvalidArgument(f"w: non-finite value {w[r, c]} at index [{r}, {c}]")
    importance, packed = prepared
    if packed is None:
        packed = quantize(w, importance)
    acc = _ErrAcc()
    step = max(1, _ERR_ELEMS // w.shape[1])
    for r0 in range(0, w.shape[0], step):
        r1 = min(w.shape[0], r0 + step)
        acc.add(w[r0:r1], packed.dequantize_rows(r0, r1))
    return packed, acc.result()


def fp8_tensor(reader: StReader, t: TensorInfo):
    """``[codes [out, in] u8, weight_scale_inv f32 scalar]`` and the error.

    Every pass (absmax, encode, error) reads the memory map in row blocks, converts a
    block to float32 and drops its pages once used: the peak is the 1-byte codes plus
    one block, not a float32 copy of the tensor (which an F16 / BF16 weight would need)."""
    from .. import fp8

    src = reader.array(t)
    row_bytes = t.nbytes // t.shape[0]

    def release(r0: int, r1: int) -> None:
        reader.release(t, r0 * row_bytes, (r1 - r0) * row_bytes)

    def to32(block: np.ndarray) -> np.ndarray:
        if t.dtype == "BF16":  # bfloat16 is the top half of a float32
            return (block.astype(np.uint32) << 16).view(np.float32)
        return np.asarray(block, np.float32)

    codes, scale = fp8_quantize(fp8, src, to32, release)
    acc = _ErrAcc()
    step = max(1, _ERR_ELEMS // t.shape[1])
    for r0 in range(0, t.shape[0], step):
        r1 = min(t.shape[0], r0 + step)
        deq = fp8.decode(codes[r0:r1], "e4m3") * scale
        acc.add(to32(src[r0:r1]), deq)
        release(r0, r1)
    return [codes, np.asarray(scale, np.float32)], acc.result()


def fp8_quantize(fp8, w: np.ndarray, to32=None, release=None) -> tuple[np.ndarray, np.float32]:
    """E4M3 codes ``[out, in]`` and ``weight_scale_inv`` of a 2-D weight ``w``, exactly
    as ``PerTensorFP8Linear.from_float(w)`` computes them (scale ``absmax / 448``, 1 for an
    all-zero tensor; ``encode(w / scale, saturate=True)``; the tests check the two agree
    bit for bit), but row block by row block: ``from_float`` takes a full float32 copy of
    its input first, which would double the peak memory of ``quantize``. ``to32(block)``
    converts a row block of ``w`` to float32 (default: ``w`` is float32 already);
    ``release(r0, r1)`` is called once each pass is done with rows ``r0:r1``."""
    to32 = to32 or (lambda b: b)
    rows = max(1, _CHUNK // (4 * w.shape[1]))
    absmax = np.float32(0)
    for r0 in range(0, w.shape[0], rows):
        block = to32(w[r0 : r0 + rows])
        bad = np.flatnonzero(~np.isfinite(block))
        if bad.size:  # NaN would stay NaN and inf would poison the per-tensor scale
            r, c = divmod(int(bad[0]), w.shape[1])
            raise InvalidArgument(f"w: non-finite value {block[r, c]} at index [{r0 + r}, {c}]")
        absmax = max(absmax, np.abs(block).max(initial=np.float32(0)))
        if release:
            release(r0, min(w.shape[0], r0 + rows))
    scale = absmax / np.float32(448) if absmax > 0 else np.float32(1)
    codes = np.empty(w.shape, np.uint8)
    for r0 in range(0, w.shape[0], rows):
        codes[r0 : r0 + rows] = fp8.encode(to32(w[r0 : r0 + rows]) / scale, "e4m3", saturate=True)
        if release:
            release(r0, min(w.shape[0], r0 + rows))
    return codes, np.float32(scale)


class _ErrAcc:
    """Sums for the relative Frobenius error; float32 per chunk (a report, 3 digits),
    float64 across chunks."""

    def __init__(self):
        self.num = self.den = 0.0
        self.max_abs = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        ref = np.asarray(ref, np.float32).reshape(-1)
        d = ref - np.asarray(got, np.float32).reshape(-1)
        self.num += float(np.dot(d, d))
        self.den += float(np.dot(ref, ref))
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))

    def result(self) -> tuple[float, float]:
        return (self.num / self.den) ** 0.5 if self.den else 0.0, self.max_abs
