"""deserialize never panics or over-allocates: random bytes, truncations, bit flips."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import quantrs
from quantrs import Int4Linear, Int8Linear, PerTensorFP8Linear, UnquantLinear

CLASSES = [PerTensorFP8Linear, UnquantLinear, Int8Linear, Int4Linear]


def blobs():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    fp8 = PerTensorFP8Linear.from_float(w, bias=b, activation_scale=0.5)
    return {
        PerTensorFP8Linear: fp8.serialize(),
        UnquantLinear: fp8.apply_isq(None).serialize(),
        Int8Linear: fp8.apply_isq("int8").serialize(),
        Int4Linear: fp8.apply_isq("int4").serialize(),
    }


BLOBS = blobs()


def must_fail(cls, data):
    with pytest.raises(quantrs.SerializationError):
        cls.deserialize(data)
    with pytest.raises(quantrs.SerializationError):
        cls.deserialize_ext_bias(data)


@given(st.binary(max_size=300), st.sampled_from(CLASSES))
def test_random_bytes(data, cls):
    must_fail(cls, data)


@given(st.sampled_from(CLASSES), st.data())
def test_truncations(cls, data):
    blob = BLOBS[cls]
    n = data.draw(st.integers(0, len(blob) - 1))
    must_fail(cls, blob[:n])


@given(st.sampled_from(CLASSES), st.data())
def test_bit_flips(cls, data):
    blob = bytearray(BLOBS[cls])
    i = data.draw(st.integers(0, len(blob) * 8 - 1))
    blob[i // 8] ^= 1 << (i % 8)
    must_fail(cls, bytes(blob))


def reseal(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


@given(st.sampled_from(CLASSES), st.data())
def test_bit_flips_with_valid_crc(cls, data):
    """A corrupted body with a recomputed CRC must still be rejected or
    decode to a valid layer, never crash."""
    body = bytearray(BLOBS[cls][:-4])
    i = data.draw(st.integers(0, len(body) * 8 - 1))
    body[i // 8] ^= 1 << (i % 8)
    try:
        layer = cls.deserialize(reseal(bytes(body)))
    except quantrs.SerializationError:
        return
    layer.dequantize_w()  # whatever decoded is a usable layer


def test_huge_lengths_do_not_allocate():
    body = bytearray(BLOBS[PerTensorFP8Linear][:-4])
    # weight byte length -> 2^63, dims -> huge: rejected before any allocation
    struct.pack_into("<Q", body, 6, 1 << 63)
    must_fail(PerTensorFP8Linear, reseal(bytes(body)))
    body = bytearray(BLOBS[PerTensorFP8Linear][:-4])
    struct.pack_into("<QQ", body, 16, 1 << 40, 1 << 40)
    must_fail(PerTensorFP8Linear, reseal(bytes(body)))


def test_header_checks():
    blob = BLOBS[PerTensorFP8Linear]
    must_fail(PerTensorFP8Linear, reseal(struct.pack("<I", 2) + blob[4:-4]))  # version
    must_fail(PerTensorFP8Linear, reseal(blob[:4] + b"\x09" + blob[5:-4]))  # tag
    must_fail(Int8Linear, blob)  # another layer's blob
    must_fail(PerTensorFP8Linear, blob + b"\x00")  # trailing byte breaks the CRC
    must_fail(PerTensorFP8Linear, reseal(blob[:-4] + b"\x00"))  # trailing byte, valid CRC
    with pytest.raises(TypeError):
        PerTensorFP8Linear.deserialize("not bytes")
    # bytearray / memoryview are accepted
    assert PerTensorFP8Linear.deserialize(bytearray(blob)).serialize() == blob
    assert PerTensorFP8Linear.deserialize(memoryview(blob)).serialize() == blob
