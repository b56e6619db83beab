"""The k-quant-style INT4 format ``int4_k`` (docs/int4.md "k-quant-style INT4"):
values against an independent NumPy dequantizer, the forward against float64, the
search against rtn under its weighted error, bytes and bad input."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from _packed_modules import assert_first_layer_is_packed, only_first, two_layer_model

import quantrs

RNG = np.random.default_rng(27)


def weight(out: int, inp: int) -> np.ndarray:
    w = RNG.standard_normal((out, inp)).astype(np.float32)
    w[:, ::3] += 0.5  # groups of both signs of minimum
    return w


def random_parts(out: int, inp: int):
    """Every code, every 6-bit pattern, finite halves of both signs."""
    codes = (np.arange(out * inp) % 16).astype(np.uint8).reshape(out, inp)
    RNG.shuffle(codes, axis=1)
    scale_codes = RNG.integers(0, 64, (out, inp // 32, 2), dtype=np.uint8)
    sb = 256 if inp % 256 == 0 else inp
    supers = RNG.uniform(-2, 2, (out, inp // sb, 2)).astype(np.float16).astype(np.float32)
    return codes, scale_codes, supers


def numpy_dequantize(codes, scale_codes, supers) -> np.ndarray:
    """``w = (D * sc) * q - (Dmin * mn)``, each product rounded to float32 (llama.cpp
    Q4_K's ``dequantize_row_q4_K``), written without the library."""
    out, inp = codes.shape
    sb = inp // supers.shape[1]
    big_d = np.repeat(supers[:, :, 0], sb // 32, axis=1)
    big_m = np.repeat(supers[:, :, 1], sb // 32, axis=1)
    d = (big_d * scale_codes[:, :, 0].astype(np.float32)).astype(np.float32)
    m = (big_m * scale_codes[:, :, 1].astype(np.float32)).astype(np.float32)
    d, m = np.repeat(d, 32, axis=1), np.repeat(m, 32, axis=1)
    return (d * codes.astype(np.float32)).astype(np.float32) - m


@pytest.mark.parametrize("shape", [(3, 96), (2, 512), (4, 576)])
def test_parts_decode_as_numpy(shape):
    parts = random_parts(*shape)
    qw = quantrs.Int4KWeight.from_parts(*parts)
    np.testing.assert_array_equal(qw.codes(), parts[0])
    np.testing.assert_array_equal(qw.scale_codes(), parts[1])
    np.testing.assert_array_equal(qw.supers(), parts[2])
    ref = numpy_dequantize(*parts)
    assert (qw.dequantize().view(np.uint32) == ref.view(np.uint32)).all()
    np.testing.assert_array_equal(qw.dequantize_rows(1, 2), ref[1:2])
    groups, sb = shape[1] // 32, qw.super_block
    assert qw.nbytes == shape[0] * (shape[1] // 2 + (3 * groups + 1) // 2 + 4 * shape[1] // sb)


def test_forward_layer_and_bytes():
    w = weight(24, 576)
    bias = RNG.standard_normal(24).astype(np.float32)
    qw = quantrs.Int4KWeight.quantize(w)
    deq = qw.dequantize().astype(np.float64)
    sc = qw.scale_codes().astype(np.float64)
    sup = qw.supers().astype(np.float64)
    per_group = sc.shape[1] // sup.shape[1]
    big_d, big_m = (np.repeat(sup[:, :, k], per_group, axis=1) for k in (0, 1))
    d_full = np.repeat(big_d * sc[:, :, 0], 32, axis=1)
    m_full = np.repeat(big_m * sc[:, :, 1], 32, axis=1)
    # The fused kernel's bound (docs/int4.md): (in + 3) eps sum (|d q| + |m|) |x|.
    mag_w = np.abs(d_full * qw.codes()) + np.abs(m_full)
    for rows in (1, 5, 40):
        x = RNG.standard_normal((rows, 576)).astype(np.float32)
        ref = x.astype(np.float64) @ deq.T
        bound = 579 * np.finfo(np.float32).eps * (np.abs(x) @ mag_w.T)
        assert (np.abs(qw.matmul(x) - ref) <= bound).all()
    layer = qw.to_layer(bias)
    assert layer.format == "int4_k"
    x = RNG.standard_normal((3, 576)).astype(np.float32)
    np.testing.assert_allclose(layer.forward(x), qw.matmul(x) + bias, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(layer.dequantize_w(), qw.dequantize())
    blob = layer.serialize()
    back = quantrs.QuantLinear.deserialize(blob)
    assert back.serialize() == blob
    with pytest.raises(quantrs.SerializationError):
        quantrs.QuantLinear.deserialize(blob[:-7])
    # The generic constructor quantizes by rtn.
    gen = quantrs.QuantLinear(w, "int4_k")
    rtn = quantrs.Int4KWeight.quantize(w, method="rtn")
    np.testing.assert_array_equal(gen.dequantize_w(), rtn.dequantize())


def test_a_non_finite_half_in_bytes_names_the_field():
    codes, scale_codes, supers = random_parts(2, 64)
    layer = quantrs.Int4KWeight.from_parts(codes, scale_codes, supers).to_layer()
    blob = bytearray(layer.serialize())
    # The halves (D, Dmin) of each row are the blob's last tensor, before its CRC32
    # (little-endian, of everything before it): the final half is row 1's Dmin.
    blob[-6:-4] = np.float16(np.inf).tobytes()
    blob[-4:] = zlib.crc32(bytes(blob[:-4])).to_bytes(4, "little")
    with pytest.raises(quantrs.SerializationError, match="row 1 super-block 0 Dmin"):
        quantrs.QuantLinear.deserialize(bytes(blob))


@pytest.mark.parametrize("use_importance", [False, True])
def test_search_is_never_worse_than_rtn(use_importance):
    w = weight(16, 512)
    imp = RNG.uniform(0.01, 4, 512).astype(np.float32) if use_importance else None
    wt = np.ones(512) if imp is None else imp.astype(np.float64)
    rtn = quantrs.Int4KWeight.quantize(w, method="rtn", importance=imp).dequantize()
    srch = quantrs.Int4KWeight.quantize(w, method="search", importance=imp).dequantize()
    e_r = ((w - rtn).astype(np.float64) ** 2 * wt).sum(axis=1)
    e_s = ((w - srch).astype(np.float64) ** 2 * wt).sum(axis=1)
    assert (e_s <= e_r).all()
    assert e_s.sum() < 0.9 * e_r.sum()


def test_bad_arguments_name_themselves():
    w = weight(2, 64)
    with pytest.raises(quantrs.QuantError, match="method"):
        quantrs.Int4KWeight.quantize(w, method="full")
    with pytest.raises(quantrs.QuantError, match="multiple of 32"):
        quantrs.Int4KWeight.quantize(w[:, :48].copy())
    with pytest.raises(quantrs.QuantError, match="importance"):
        quantrs.Int4KWeight.quantize(w, importance=-np.ones(64, np.float32))
    with pytest.raises(quantrs.QuantError, match=r"w\[0, 0\] is .*\|w\| <= 65504"):
        quantrs.Int4KWeight.quantize(w * 1e9)
    codes, scale_codes, supers = random_parts(2, 64)
    bad = scale_codes.copy()
    bad[1, 0, 1] = 64
    with pytest.raises(quantrs.QuantError, match=r"mn\[1, 0\] is 64"):
        quantrs.Int4KWeight.from_parts(codes, bad, supers)
    with pytest.raises(quantrs.QuantError, match="supers"):
        quantrs.Int4KWeight.from_parts(codes, scale_codes, supers + np.float32(1e-4))


def test_quantize_routes_int4_k_to_packed_modules():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    model, w0, calib, imp = two_layer_model(torch)
    # With calibration and no quantizer: the importance-weighted search.
    qt.quantize_(model, "int4_k", filter_fn=only_first, calibration=calib)
    ref = quantrs.Int4KWeight.quantize(w0, method="search", importance=imp)
    assert_first_layer_is_packed(torch, model, ref)
    with pytest.raises(quantrs.QuantError, match="method"):
        qt.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 8)), "int4_k", quantizer="full")
