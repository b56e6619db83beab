"""quantrs.formats: GPTQ / AWQ / GGUF imports, GGUF export, checkpoint folders.

Fixtures follow the producers' conventions: GGUF files come from the ``gguf`` package's
own writer and quantizer; GPTQ / AWQ tensors from NumPy packers written here from the
packing rules (docs/checkpoints.md); values are checked against independent NumPy
decoders, bit for bit where the format is exact.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

import quantrs
from quantrs.formats import (
    Checkpoint,
    FormatError,
    GgufFile,
    RequantizedWarning,
    load_awq,
    load_gguf,
    load_gptq,
    save_gguf,
)

gguf = pytest.importorskip("gguf")

RNG = np.random.default_rng(2024)


# --- independent packers and decoders ----------------------------------------------------


def pack_gptq(q: np.ndarray, zeros_stored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ packing: ``qweight[r, o]`` holds rows ``8r..8r+7`` of ``q [in, out]``, row
    ``8r + j`` in bits ``4j..4j+3``; ``qzeros[g, c]`` holds columns ``8c..8c+7`` of the
    stored zero points the same way."""
    inf, out = q.shape
    qweight = np.zeros((inf // 8, out), np.uint32)
    for j in range(8):
        qweight |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
    g = zeros_stored.shape[0]
    qzeros = np.zeros((g, out // 8), np.uint32)
    for j in range(8):
        qzeros |= (zeros_stored[:, j::8] & 0xF).astype(np.uint32) << np.uint32(4 * j)
    return qweight.view(np.int32), qzeros.view(np.int32)


def gptq_dequant(qweight, qzeros, scales, g_idx, v1=True) -> np.ndarray:
    """GPTQ's formula ``s * (q - (z + 1))`` (v1) element by element, float32."""
    inf, out = qweight.shape[0] * 8, qweight.shape[1]
    u = qweight.view(np.uint32)
    uz = qzeros.view(np.uint32)
    w = np.empty((inf, out), np.float32)
    for i in range(inf):
        q = (u[i // 8] >> np.uint32(4 * (i % 8))) & 0xF
        g = g_idx[i]
        z = np.array([(uz[g, o // 8] >> (4 * (o % 8))) & 0xF for o in range(out)])
        zero = (z + 1) & 0xF if v1 else z  # v1: zero 0 is stored as -1 (all ones)
        w[i] = scales[g].astype(np.float32) * (q.astype(np.float32) - zero.astype(np.float32))
    return w


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]  # position of column k's nibble in its word


def pack_awq(q: np.ndarray) -> np.ndarray:
    """AWQ GEMM packing along the output dimension: nibble ``j`` of word ``[i, c]``
    holds column ``8c + AWQ_ORDER[j]``."""
    rows, out = q.shape
    packed = np.zeros((rows, out // 8), np.uint32)
    for c in range(out // 8):
        for j in range(8):
            packed[:, c] |= q[:, 8 * c + AWQ_ORDER[j]].astype(np.uint32) << np.uint32(4 * j)
    return packed.view(np.int32)


def awq_unpack(packed: np.ndarray) -> np.ndarray:
    u = packed.view(np.uint32)
    rows, words = u.shape
    q = np.empty((rows, words * 8), np.uint8)
    for o in range(words * 8):
        q[:, o] = (u[:, o // 8] >> np.uint32(4 * AWQ_REVERSE[o % 8])) & 0xF
    return q


def matmul_ref(w_in_out: np.ndarray, x: np.ndarray, bias=None) -> np.ndarray:
    y = x.astype(np.float64) @ w_in_out.astype(np.float64)
    return y if bias is None else y + bias


def write_folder(path, config: dict, shards: dict[str, dict], index: bool = True):
    """A model folder: ``config.json``, the shards, and the index naming them."""
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    wmap = {}
    for fname, tensors in shards.items():
        save_file(tensors, str(path / fname))
        wmap.update(dict.fromkeys(tensors, fname))
    if index:
        idx = {"metadata": {"total_size": 0}, "weight_map": wmap}
        (path / "model.safetensors.index.json").write_text(json.dumps(idx))
    return path


# --- GPTQ ---------------------------------------------------------------------------------


def gptq_layer(inf, out, gs, sym=True, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, (inf, out), dtype=np.uint8)
    groups = -(-inf // gs)
    zeros = np.full((groups, out), 8) if sym else rng.integers(0, 16, (groups, out))
    if not sym:
        zeros[0, 0] = 0  # stored as -1: all ones in the field
    qweight, qzeros = pack_gptq(q, zeros - 1)  # v1 stores zero - 1
    scales = (rng.standard_normal((groups, out)) * 0.02).astype(np.float16)
    g_idx = (np.arange(inf) // gs).astype(np.int32)
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}


@pytest.mark.parametrize("inf,out,gs", [(128, 64, 32), (200, 48, 64), (64, 16, 128), (96, 8, -1)])
def test_gptq_symmetric_is_bit_exact(tmp_path, inf, out, gs):
    layer = gptq_layer(inf, out, gs if gs > 0 else inf, seed=inf)
    bias = RNG.standard_normal(out).astype(np.float16)
    tensors = {f"model.layers.0.mlp.up_proj.{k}": v for k, v in layer.items()}
    tensors["model.layers.0.mlp.up_proj.bias"] = bias
    folder = write_folder(
        tmp_path / "m",
        {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": gs}},
        {"model.safetensors": tensors},
        index=False,
    )
    lin = load_gptq(folder, "model.layers.0.mlp.up_proj")
    assert isinstance(lin, quantrs.Int4Linear)
    want = gptq_dequant(layer["qweight"], layer["qzeros"], layer["scales"], layer["g_idx"])
    got = lin.qweight.dequantize()
    assert got.shape == (inf, out)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # bit for bit
    assert np.array_equal(lin.bias, bias.astype(np.float32))
    x = RNG.standard_normal((3, inf)).astype(np.float32)
    np.testing.assert_allclose(
        lin.forward(x), matmul_ref(want, x, bias.astype(np.float64)), rtol=1e-4, atol=1e-4
    )
    # the same file, read through a file path and quantize_config.json instead
    (folder / "config.json").write_text("{}")
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": gs}))
    lin2 = load_gptq(folder / "model.safetensors", "model.layers.0.mlp.up_proj")
    assert lin2.qweight == lin.qweight


def test_gptq_v2_zero_points_are_not_shifted(tmp_path):
    layer = gptq_layer(64, 16, 32)
    _, qzeros_v2 = pack_gptq(np.zeros((64, 16), np.uint8), np.full((2, 16), 8))
    layer["qzeros"] = qzeros_v2
    folder = write_folder(
        tmp_path / "m",
        {
            "quantization_config": {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": 32,
                "checkpoint_format": "gptq_v2",
            }
        },  # fmt: skip
        {"model.safetensors": {f"l.{k}": v for k, v in layer.items()}},
        index=False,
    )
    got = load_gptq(folder, "l").qweight.dequantize()
    want = gptq_dequant(layer["qweight"], qzeros_v2, layer["scales"], layer["g_idx"], v1=False)
    assert np.array_equal(got, want)
    # read as v1, the same zeros are 9: asymmetric, so int_zp (test_gptq_exact.py)
    (folder / "config.json").write_text(json.dumps({"quantization_config": {"bits": 4}}))
    lin = load_gptq(folder, "l")
    assert lin.format == "int_zp"
    want = gptq_dequant(layer["qweight"], qzeros_v2, layer["scales"], layer["g_idx"], v1=True)
    assert np.array_equal(lin.dequantize_w(), want.T)


def test_gptq_refusals_and_requantize(tmp_path):
    # Groups of 16: neither INT4 (asymmetric, act-order) nor int_zp (runs of 32) holds
    # them; test_gptq_exact.py loads the representable cases.
    asym = gptq_layer(48, 16, 16, sym=False, seed=3)
    assert np.asarray(asym["qzeros"]).view(np.uint32)[0, 0] & 0xF == 0xF  # zero point 0
    actorder = gptq_layer(48, 16, 16, seed=4)
    actorder["g_idx"] = np.random.default_rng(0).permutation(np.arange(48) // 16).astype(np.int32)
    tensors = {f"a.{k}": v for k, v in asym.items()} | {f"b.{k}": v for k, v in actorder.items()}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(FormatError, match=r"'a'.*asymmetric zero points"):
        load_gptq(path, "a")
    with pytest.raises(FormatError, match=r"'b'.*act-order g_idx"):
        load_gptq(path, "b")
    for name, layer in (("a", asym), ("b", actorder)):
        with pytest.warns(RequantizedWarning, match="relative error"):
            lin = load_gptq(path, name, requantize=True)
        ref = gptq_dequant(layer["qweight"], layer["qzeros"], layer["scales"], layer["g_idx"])
        err = np.linalg.norm(lin.qweight.dequantize() - ref) / np.linalg.norm(ref)
        assert 0 < err < 0.2


def test_gptq_bad_shapes_and_missing(tmp_path):
    layer = gptq_layer(64, 16, 32)
    path = tmp_path / "m.safetensors"
    bad = dict(layer, scales=layer["scales"][:, :8])
    save_file({f"l.{k}": v for k, v in bad.items()}, str(path))
    with pytest.raises(FormatError, match="inconsistent shapes"):
        load_gptq(path, "l")
    save_file({f"l.{k}": v for k, v in layer.items() if k != "qzeros"}, str(path))
    with pytest.raises(FormatError, match="missing tensor 'l.qzeros'"):
        load_gptq(path, "l")
    save_file({f"l.{k}": v for k, v in dict(layer, g_idx=layer["g_idx"] + 5).items()}, str(path))
    with pytest.raises(FormatError, match="group indices"):
        load_gptq(path, "l")


# --- AWQ ----------------------------------------------------------------------------------


def test_awq_gemm_is_bit_exact(tmp_path):
    inf, out, gs = 256, 32, 128
    q = RNG.integers(0, 16, (inf, out), dtype=np.uint8)
    qweight = pack_awq(q)
    assert np.array_equal(awq_unpack(qweight), q)
    qzeros = pack_awq(np.full((2, out), 8, np.uint8))
    scales = (RNG.standard_normal((2, out)) * 0.01).astype(np.float16)
    bias = RNG.standard_normal(out).astype(np.float16)
    folder = write_folder(
        tmp_path / "m",
        {
            "quantization_config": {
                "quant_method": "awq",
                "bits": 4,
                "group_size": gs,
                "version": "gemm",
                "zero_point": True,
            }
        },  # fmt: skip
        {
            "model.safetensors": {
                "p.qweight": qweight,
                "p.qzeros": qzeros,
                "p.scales": scales,
                "p.bias": bias,
            }
        },  # fmt: skip
        index=False,
    )
    lin = load_awq(folder, "p")
    g = np.arange(inf) // gs
    want = scales[g].astype(np.float32) * (q.astype(np.float32) - np.float32(8))
    assert np.array_equal(lin.qweight.dequantize().view(np.uint32), want.view(np.uint32))
    assert np.array_equal(lin.bias, bias.astype(np.float32))
    x = RNG.standard_normal((2, inf)).astype(np.float32)
    np.testing.assert_allclose(lin.forward(x), matmul_ref(want, x, bias), rtol=1e-4, atol=1e-4)


def test_awq_other_zeros_and_gemv_refused(tmp_path):
    # Groups of 16: other zero points than 8 that int_zp (runs of 32) cannot hold either;
    # test_awq_exact.py loads the representable cases.
    q = RNG.integers(0, 16, (48, 16), dtype=np.uint8)
    zeros = RNG.integers(0, 16, (3, 16), dtype=np.uint8)
    zeros[0, 0] = 3
    t = {"p.qweight": pack_awq(q), "p.qzeros": pack_awq(zeros),
         "p.scales": np.full((3, 16), 0.5, np.float16)}  # fmt: skip
    folder = write_folder(
        tmp_path / "m", {"quantization_config": {"quant_method": "awq", "group_size": 16}},
        {"model.safetensors": t}, index=False,
    )  # fmt: skip
    with pytest.raises(FormatError, match="zero points other than 8"):
        load_awq(folder, "p")
    with pytest.warns(RequantizedWarning):
        lin = load_awq(folder, "p", requantize=True)
    z = awq_unpack(pack_awq(zeros)).astype(np.float32)[np.arange(48) // 16]
    want = np.float32(0.5) * (q.astype(np.float32) - z)
    assert np.linalg.norm(lin.qweight.dequantize() - want) / np.linalg.norm(want) < 0.15
    (folder / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "awq", "version": "gemv"}})
    )
    with pytest.raises(FormatError, match="GEMM"):
        load_awq(folder, "p")


# --- GGUF ---------------------------------------------------------------------------------


def gguf_file(path, tensors: dict, qtype=None, extra=None):
    """A GGUF file written by the gguf package; ``tensors`` float32 ``[out, in]``."""
    w = gguf.GGUFWriter(str(path), "llama")
    qtype = gguf.GGMLQuantizationType.Q4_0 if qtype is None else qtype
    for name, a in tensors.items():
        if a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    for name, a in (extra or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.kernel
def test_gguf_q4_0_exact_with_negative_and_zero_scales(tmp_path):
    w = RNG.standard_normal((48, 96)).astype(np.float32)
    w[3, :32] = 0  # an all-zero block: scale 0
    path = gguf_file(
        tmp_path / "m.gguf", {"blk.0.attn_q.weight": w}, extra={"norm": np.ones(96, np.float32)}
    )
    qw = load_gguf(path, "blk.0.attn_q.weight")
    assert (qw.in_feat, qw.out_feat, qw.group_size) == (96, 48, 32)
    scales = np.asarray(qw.scales).reshape(-1, 48)
    assert (scales < 0).any() and (scales > 0).any() and (scales == 0).any()
    # the gguf package's own decoder, bit for bit
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    want = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_0).reshape(48, 96)
    assert np.array_equal(
        qw.dequantize().T.view(np.uint32), want.astype(np.float32).view(np.uint32)
    )
    # every kernel with those scales, against NumPy
    for batch in (1, 3, 9, 17):
        x = RNG.standard_normal((batch, 96)).astype(np.float32)
        ref = x.astype(np.float64) @ want.T.astype(np.float64)
        bound = np.abs(x).astype(np.float64) @ np.abs(want.T).astype(np.float64)
        assert np.all(np.abs(qw.matmul(x) - ref) <= 1e-5 * bound + 1e-6)
    assert np.all(np.abs(qw.matvec(x[0]) - ref[0]) <= 1e-5 * bound[0] + 1e-6)
    lin = quantrs.Int4Linear(qw)
    np.testing.assert_allclose(lin.forward(x), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.kernel
def test_raw_constructor_accepts_any_finite_scale():
    qw = quantrs.QuantizedWeight.quantize(RNG.standard_normal((64, 8)).astype(np.float32))
    s = np.asarray(qw.scales).copy()
    s[::3] *= -1
    s[1] = 0
    neg = quantrs.QuantizedWeight(qw.data, s, 64, 8, 2)
    codes = np.array([[neg_code(qw, r, o) for o in range(8)] for r in range(64)], np.float32)
    want = codes * s.reshape(2, 8)[np.arange(64) // 32]
    assert np.array_equal(neg.dequantize(), want)
    x = RNG.standard_normal((9, 64)).astype(np.float32)
    np.testing.assert_allclose(neg.matmul(x), x.astype(np.float64) @ want, rtol=1e-5, atol=1e-5)
    for bad in (np.nan, np.inf, -np.inf):
        s2 = s.copy()
        s2[5] = bad
        with pytest.raises(ValueError, match=r"scales\[5\]"):
            quantrs.QuantizedWeight(qw.data, s2, 64, 8, 2)


def neg_code(qw, r: int, o: int) -> int:
    b = int(np.asarray(qw.data)[(r // 2) * qw.out_feat + o])
    nib = b & 0xF if r % 2 == 0 else b >> 4
    return nib - 16 if nib >= 8 else nib


def test_gguf_other_types_refused_or_requantized(tmp_path):
    w = RNG.standard_normal((16, 64)).astype(np.float32)
    path = gguf_file(tmp_path / "m.gguf", {"w": w}, qtype=gguf.GGMLQuantizationType.Q8_0)
    with pytest.raises(FormatError, match=r"'w'.*Q8_0 is not Q4_0"):
        load_gguf(path, "w")
    with pytest.warns(RequantizedWarning, match="relative error"):
        qw = load_gguf(path, "w", requantize=True)
    want = quantrs.QuantizedWeight.quantize(
        np.ascontiguousarray(
            gguf.quants.dequantize(
                gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                gguf.GGMLQuantizationType.Q8_0,
            ).T.astype(np.float32)
        )
    )
    assert qw == want
    with pytest.raises(FormatError, match="no tensor 'nope'"):
        load_gguf(path, "nope")


def test_save_gguf_read_by_gguf_package(tmp_path):
    w = RNG.standard_normal((96, 40)).astype(np.float32)  # [in, out]
    qw = quantrs.QuantizedWeight.quantize(w, group_size=32)
    path = tmp_path / "out.gguf"
    rows = save_gguf(path, {"blk.0.ffn_up.weight": qw})
    assert rows[0]["type"] == "Q4_0" and rows[0]["shape"] == [40, 96]
    assert 0 < rows[0]["max_scale_rel_change"] < 2**-11
    assert 0 < rows[0]["rel_err"] < 1e-3
    reader = gguf.GGUFReader(str(path))
    (t,) = reader.tensors
    assert t.name == "blk.0.ffn_up.weight"
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert list(t.shape) == [96, 40]  # ne: in first
    got = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_0).reshape(40, 96)
    codes = qw.dequantize() / np.repeat(np.asarray(qw.scales).reshape(3, 40), 32, 0)
    s16 = np.asarray(qw.scales).reshape(3, 40).astype(np.float16).astype(np.float32)
    want = np.rint(codes).astype(np.float32) * np.repeat(s16, 32, 0)
    assert np.array_equal(got, want.T)
    # and back: the same codes, scales rounded to F16
    back = load_gguf(path, "blk.0.ffn_up.weight")
    assert np.array_equal(np.asarray(back.data), np.asarray(qw.data))
    assert np.array_equal(np.asarray(back.scales), s16.reshape(-1))
    with pytest.raises(FormatError, match="group size 32"):
        save_gguf(tmp_path / "x.gguf", {"w": quantrs.QuantizedWeight.quantize(w, group_size=16)})
    assert not (tmp_path / "x.gguf").exists()


def test_gguf_round_trip_through_gguf_writer(tmp_path):
    """quantrs -> GGUF (ours) -> quantrs is the identity for F16-exact scales."""
    w = RNG.standard_normal((64, 24)).astype(np.float32)
    qw = quantrs.QuantizedWeight.quantize(w)
    s16 = np.asarray(qw.scales).astype(np.float16).astype(np.float32)
    qw16 = quantrs.QuantizedWeight(qw.data, s16, 64, 24, 2)
    save_gguf(tmp_path / "a.gguf", {"a": qw16, "b": qw16})
    assert load_gguf(tmp_path / "a.gguf", "b") == qw16


def _gguf_bytes(tmp_path) -> bytes:
    path = gguf_file(tmp_path / "ok.gguf", {"w": RNG.standard_normal((8, 64)).astype(np.float32)})
    return path.read_bytes()


def test_gguf_corrupt_and_truncated(tmp_path):
    good = _gguf_bytes(tmp_path)
    with GgufFile(tmp_path / "ok.gguf") as g:
        t = g.tensors["w"]
        info_end = t.offset  # data starts at (aligned) tensor data
    cases = {
        "empty": b"",
        "magic": b"GGUX" + good[4:],
        "version": good[:4] + struct.pack("<I", 2) + good[8:],
        "truncated_data": good[: info_end + 10],
        "truncated_header": good[:40],
        "huge_count": good[:8] + struct.pack("<Q", 1 << 40) + good[16:],
    }
    for name, raw in cases.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(raw)
        with pytest.raises(FormatError):
            load_gguf(p, "w")
    # a tensor offset that is not aligned, and one past the end of the file
    pos = good.find(struct.pack("<Q", 1) + b"w") + 9  # info of "w": n_dims, dims, type, offset
    n_dims = struct.unpack_from("<I", good, pos)[0]
    off_pos = pos + 4 + 8 * n_dims + 4
    for off, needle in ((3, "multiple"), (1 << 20, "truncated")):
        bad = bytearray(good)
        struct.pack_into("<Q", bad, off_pos, off)
        p = tmp_path / "bad_off.gguf"
        p.write_bytes(bytes(bad))
        with pytest.raises(FormatError, match=needle):
            load_gguf(p, "w")


# --- model folders ------------------------------------------------------------------------


def test_checkpoint_folder_validation(tmp_path):
    a = {"x.weight": np.ones((2, 2), np.float32), "x.bias": np.ones(2, np.float32)}
    b = {"y.weight": np.ones((2, 2), np.float32)}
    folder = write_folder(tmp_path / "m", {}, {"s1.safetensors": a, "s2.safetensors": b})
    with Checkpoint(folder) as ck:
        assert sorted(ck.names()) == ["x.bias", "x.weight", "y.weight"]
        assert np.array_equal(ck.float32("y.weight"), b["y.weight"])
    idx_path = folder / "model.safetensors.index.json"
    idx = json.loads(idx_path.read_text())
    cases = [
        (
            {**idx["weight_map"], "z.weight": "s3.safetensors"},
            "'s3.safetensors' named by the index is missing",
        ),
        ({**idx["weight_map"], "z.weight": "s2.safetensors"}, "names tensor 'z.weight'"),
        (
            {"x.weight": "s1.safetensors", "y.weight": "s2.safetensors"},
            "'x.bias', which the index does not list",
        ),
        ({**idx["weight_map"], "z": "../s2.safetensors"}, "not a file in the folder"),
        ({**idx["weight_map"], "x.weight": "s2.safetensors"}, "puts in 's2.safetensors'"),
    ]
    for wmap, needle in cases:
        idx_path.write_text(json.dumps({"weight_map": wmap}))
        with pytest.raises(FormatError, match=needle):
            Checkpoint(folder)
    idx_path.write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        Checkpoint(folder)
    idx_path.unlink()
    with pytest.raises(FormatError, match="2 .safetensors files"):
        Checkpoint(folder)
    (folder / "s2.safetensors").write_bytes(b"\x00" * 3)
    (folder / "s2.safetensors").rename(folder / "junk.bin")
    with Checkpoint(folder) as ck:  # the only .safetensors file left
        assert sorted(ck.names()) == ["x.bias", "x.weight"]
    (folder / "s1.safetensors").write_bytes((folder / "junk.bin").read_bytes())
    with pytest.raises(FormatError, match="not a valid safetensors file"):
        Checkpoint(folder)
