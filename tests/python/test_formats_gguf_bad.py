"""The GGUF reader on hostile headers (docs/security.md): each defect found
while adding the ``gguf_load`` atheris target (tests/fuzz/atheris_targets.py)
is a ``FormatError`` naming the file and the tensor, never a NumPy error, a
``ZeroDivisionError`` or a quantrs error about an argument the caller never
passed. The files are written by hand: a header whose fields the test chooses."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

from quantrs.formats import FormatError
from quantrs.formats.gguf import GgufFile, load_gguf, read_gguf_weight

F32, F16, Q4_0 = 0, 1, 2


def gguf_bytes(tensors, data: bytes = b"") -> bytes:
    """A version-3 GGUF file: no metadata, ``tensors`` as (name, ne, ggml type,
    offset), then ``data`` (64 zero bytes when empty) after 32-byte alignment."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 0)
    for name, dims, type_id, offset in tensors:
        n = name.encode()
        head += struct.pack("<Q", len(n)) + n + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", type_id, offset)
    head += b"\0" * (-len(head) % 32)
    return head + (data or b"\0" * 64)


@pytest.mark.parametrize(
    "dims,type_id",
    [
        ((0, 2**64 - 1), F32),  # NumPy cannot shape it ("one unknown dimension")
        ((0, 4), Q4_0),  # in_feat // 32 = 0 blocks: a ZeroDivisionError
        ((32, 0), Q4_0),  # out_feat 0 reached QuantizedWeight as an argument error
        ((0, 5), F32),
        ((4, 0), F32),
        ((0, 2**40, 2**40, 2**40), F32),
    ],
)
def test_zero_dimension_is_a_format_error(tmp_path, dims, type_id):
    path = tmp_path / "z.gguf"
    path.write_bytes(gguf_bytes([("w", dims, type_id, 0)]))
    with pytest.raises(FormatError, match=r"z\.gguf.*tensor 'w': a zero dimension in ne"):
        GgufFile(path)
    with pytest.raises(FormatError, match="zero dimension"):
        load_gguf(path, "w", requantize=True)


@pytest.mark.parametrize("bits,text", [(0x7E00, "NaN"), (0x7C00, "inf"), (0xFC00, "-inf")])
def test_q4_0_non_finite_scale_is_a_format_error(tmp_path, bits, text):
    path = tmp_path / "s.gguf"
    block = struct.pack("<H", bits) + bytes(range(16))
    path.write_bytes(gguf_bytes([("w", (32, 1), Q4_0, 0)], block + b"\0" * 14))
    with pytest.raises(FormatError, match=rf"s\.gguf: tensor 'w': .*scales\[0\].*{text}"):
        load_gguf(path, "w")
    # the raw decode is NumPy's and keeps the non-finite scale as it is
    with GgufFile(path) as g:
        assert not np.isfinite(g.dequantize(g.tensor("w"))).all()


def test_negative_q4_0_scale_still_reads(tmp_path):
    path = tmp_path / "n.gguf"
    codes = bytes((i % 16) | ((15 - i % 16) << 4) for i in range(16))
    block = struct.pack("<e", -0.5) + codes
    path.write_bytes(gguf_bytes([("w", (32, 1), Q4_0, 0)], block + b"\0" * 14))
    with GgufFile(path) as g, warnings.catch_warnings():
        warnings.simplefilter("error")
        qw, err, _ = read_gguf_weight(g, "w")
        ref = g.dequantize(g.tensor("w"))
    assert err is None
    np.testing.assert_array_equal(qw.dequantize().T, ref)
    q = np.array([c & 15 for c in codes] + [c >> 4 for c in codes], np.float32)
    np.testing.assert_array_equal(ref[0], -0.5 * (q - 8))
