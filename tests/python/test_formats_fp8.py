"""FP8 checkpoint dialects: PerTensorFP8Linear.from_safetensors (Rust) and
quantrs.formats.load_fp8 read every per-tensor dialect with the producer's field names,
shapes and dtypes; per-channel and block scales are refused, or re-quantized on request.

Files are written by hand from the safetensors format (8-byte header length, JSON header,
raw bytes), so F8 and BF16 tensors need no library support; values are checked against
ml_dtypes' E4M3 decoder.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import quantrs
from quantrs.formats import FormatError, RequantizedWarning, load_fp8

ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.skipif(
    not hasattr(quantrs, "PerTensorFP8Linear"), reason="PerTensorFP8Linear not built"
)

RNG = np.random.default_rng(11)


def write_st(path, tensors: dict[str, tuple[str, list[int], bytes]]):
    header, data, off = {}, b"", 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def bf16_bytes(a) -> bytes:
    """Exact only for values with 8 significant bits (the tests use such values)."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)
    return (bits >> 16).astype("<u2").tobytes()


def fp8_codes(shape) -> np.ndarray:
    w = np.clip(RNG.standard_normal(shape).astype(np.float32) * 100, -448, 448)
    return w.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def decode(codes: np.ndarray) -> np.ndarray:
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)


def check_layer(layer, codes, scale, act, bias):
    assert layer.weight_scale_inv == np.float32(scale)
    assert layer.activation_scale == (None if act is None else np.float32(act))
    assert np.array_equal(np.asarray(layer.weight).reshape(codes.shape), codes)
    if bias is None:
        assert layer.bias is None
    else:
        assert np.array_equal(layer.bias, bias)
    w = decode(codes) * np.float32(scale)
    assert np.array_equal(layer.dequantize_w(), w)
    x = RNG.standard_normal((2, codes.shape[1])).astype(np.float32)
    want = quantrs.PerTensorFP8Linear(codes, scale, act, bias).forward(x)
    assert np.array_equal(layer.forward(x), want)
    if act is None:  # weight-only: x @ W.T
        ref = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if bias is None else bias)
        np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-4, atol=1e-3)


DIALECTS = {
    # name: (scale name, scale dtype, scale shape, act name, act shape, bias dtype)
    "compressed-tensors-bf16": ("weight_scale", "BF16", [1], "input_scale", [1], "BF16"),
    "compressed-tensors-f32-scalar": ("weight_scale", "F32", [], "input_scale", [], "F32"),
    "compressed-tensors-f16": ("weight_scale", "F16", [1], None, None, "F16"),
    "autofp8": ("weight_scale", "F32", [], "input_scale", [], None),
    "mistralrs": ("weight_scale_inv", "F32", [], "activation_scale", [], "F32"),
}


def _encode(values, dtype) -> bytes:
    a = np.asarray(values, np.float32)
    if dtype == "BF16":
        return bf16_bytes(a)
    return a.astype({"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_per_tensor_dialect(tmp_path, dialect):
    sname, sdt, sshape, aname, ashape, bdt = DIALECTS[dialect]
    codes = fp8_codes((24, 40))
    scale, act = 0.0078125, 0.046875  # exact in BF16 / F16 / F32
    bias = (RNG.integers(-64, 64, 24) / 16).astype(np.float32)  # exact in BF16
    t = {
        "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [24, 40], codes.tobytes()),
        f"model.layers.0.self_attn.q_proj.{sname}": (sdt, sshape, _encode([scale], sdt)),
    }
    if aname:
        t[f"model.layers.0.self_attn.q_proj.{aname}"] = (sdt, ashape, _encode([act], sdt))
    if bdt:
        t["model.layers.0.self_attn.q_proj.bias"] = (bdt, [24], _encode(bias, bdt))
    path = write_st(tmp_path / "m.safetensors", t)
    want_act = act if aname else None
    want_bias = bias if bdt else None
    prefix = "model.layers.0.self_attn.q_proj"
    check_layer(
        quantrs.PerTensorFP8Linear.from_safetensors(path, prefix), codes, scale, want_act, want_bias
    )
    check_layer(load_fp8(path, prefix), codes, scale, want_act, want_bias)


def test_non_per_tensor_scales_refused_then_requantized(tmp_path):
    codes = fp8_codes((200, 300))
    per_channel = (RNG.uniform(0.5, 2.0, (200, 1)) * 0.01).astype(np.float32)
    blocks = (RNG.uniform(0.5, 2.0, (2, 3)) * 0.01).astype(np.float32)
    path = write_st(
        tmp_path / "m.safetensors",
        {
            "a.weight": ("F8_E4M3", [200, 300], codes.tobytes()),
            "a.weight_scale": ("F32", [200, 1], per_channel.tobytes()),
            "b.weight": ("F8_E4M3", [200, 300], codes.tobytes()),
            "b.weight_scale_inv": ("F32", [2, 3], blocks.tobytes()),
        },
    )
    for prefix, needle, w in (
        ("a", "per-channel", decode(codes) * per_channel),
        (
            "b",
            "128x128 block",
            decode(codes) * np.repeat(np.repeat(blocks, 128, 0), 128, 1)[:200, :300],
        ),
    ):
        with pytest.raises(ValueError, match=needle):
            quantrs.PerTensorFP8Linear.from_safetensors(path, prefix)
        with pytest.raises(FormatError, match="not per-tensor"):
            load_fp8(path, prefix)
        with pytest.warns(RequantizedWarning, match="relative error"):
            layer = load_fp8(path, prefix, requantize=True)
        want = quantrs.PerTensorFP8Linear.from_float(w)
        assert np.array_equal(layer.dequantize_w(), want.dequantize_w())
        rel = np.linalg.norm(layer.dequantize_w() - w) / np.linalg.norm(w)
        assert 0 < rel < 0.1


def test_missing_scale_and_wrong_dtype(tmp_path):
    codes = fp8_codes((4, 8))
    path = write_st(tmp_path / "m.safetensors", {"x.weight": ("F8_E4M3", [4, 8], codes.tobytes())})
    with pytest.raises(ValueError, match="weight_scale"):
        quantrs.PerTensorFP8Linear.from_safetensors(path, "x")
    path = write_st(
        tmp_path / "m.safetensors",
        {
            "x.weight": ("F8_E4M3", [4, 8], codes.tobytes()),
            "x.weight_scale": ("I32", [1], struct.pack("<i", 1)),
        },
    )
    with pytest.raises(ValueError, match="F32, F16 or BF16"):
        quantrs.PerTensorFP8Linear.from_safetensors(path, "x")


def test_inspect_names_each_dialect(tmp_path, capsys):
    from quantrs.cli import main

    codes = fp8_codes((200, 300)).tobytes()
    f32 = np.float32(0.25).tobytes()
    path = write_st(
        tmp_path / "m.safetensors",
        {
            "ct.weight": ("F8_E4M3", [200, 300], codes),
            "ct.weight_scale": ("BF16", [1], bf16_bytes([0.25])),
            "ct.input_scale": ("BF16", [1], bf16_bytes([0.5])),
            "auto.weight": ("F8_E4M3", [200, 300], codes),
            "auto.weight_scale": ("F32", [], f32),
            "mrs.weight": ("F8_E4M3", [200, 300], codes),
            "mrs.weight_scale_inv": ("F32", [], f32),
            "pc.weight": ("F8_E4M3", [200, 300], codes),
            "pc.weight_scale": ("F32", [200, 1], f32 * 200),
            "blk.weight": ("F8_E4M3", [200, 300], codes),
            "blk.weight_scale_inv": ("F32", [2, 3], f32 * 6),
        },
    )
    assert main(["inspect", str(path), "--json"]) == 0
    kinds = {t["name"]: t["kind"] for t in json.loads(capsys.readouterr().out)["tensors"]}
    assert kinds["ct.weight"] == "fp8 e4m3, per-tensor scale 0.25 (compressed-tensors)"
    assert kinds["ct.input_scale"] == "fp8 activation scale of ct.weight"
    assert kinds["auto.weight"] == "fp8 e4m3, per-tensor scale 0.25 (fp8)"
    assert kinds["mrs.weight"] == "fp8 e4m3, per-tensor scale 0.25 (mistralrs)"
    assert kinds["pc.weight"] == "fp8 e4m3, per-channel scales"
    assert kinds["blk.weight"] == "fp8 e4m3, block-128 scales"
    assert kinds["blk.weight_scale_inv"] == "fp8 scales of blk.weight"
