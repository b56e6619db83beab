"""``quantrs convert`` keeps the exact bits: GGUF files written by the ``gguf`` package
(every block type; ``Q4_1`` as ``int4_asym``, the others as their blocks) and GPTQ / AWQ
folders with zero points (as ``int_zp``), read back against the ``gguf`` package's
dequantizer and the producers' formulas; ``quantrs inspect`` names each tensor's format."""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import _zp_packing as zp  # noqa: E402
from test_gguf_blocks import TYPES, random_blocks, write_file  # noqa: E402

import quantrs  # noqa: E402
from quantrs.cli import main  # noqa: E402
from quantrs.formats import Checkpoint  # noqa: E402
from quantrs.formats.own_layout import ALL_FORMATS, read_own  # noqa: E402

# the quantrs type each GGUF block type is written as
EXPECTED = {"Q4_0": "int4", "Q4_1": "int4_asym"}  # every other type: "gguf"


def _gguf_file(tmp_path):
    rng = np.random.default_rng(11)
    tensors = []
    for name in TYPES:
        out, inf = 4, 512
        if name.endswith("_K"):  # gguf.quants has no K-type quantizer
            blocks = random_blocks(name, out, inf, seed=5)
        else:
            w = rng.standard_normal((out, inf)).astype(np.float32)
            blocks = gguf.quants.quantize(w, gguf.GGMLQuantizationType[name])
        tensors.append((f"blk.0.{name.lower()}.weight", name, blocks, (out, inf)))
    emb = gguf.quants.quantize(
        rng.standard_normal((16, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    tensors.append(("token_embd.weight", "Q8_0", emb, (16, 64)))
    path = tmp_path / "m.gguf"
    write_file(path, tensors)
    return path, tensors


def test_gguf_every_block_type_converts_bit_exact(tmp_path, capsys):
    path, tensors = _gguf_file(tmp_path)
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), str(out), "--from", "gguf", "--no-progress", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    with Checkpoint(out) as ck:
        for tname, name, blocks, _shape in tensors:
            want = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name])
            w = read_own(ck, tname, ALL_FORMATS)
            got = w.dequantize()
            if isinstance(w, quantrs.QuantizedWeight):  # INT4 is [in, out]
                got = got.T
            else:
                want_type = EXPECTED.get(name, "gguf")
                assert w.type == (name.lower() if want_type == "gguf" else want_type)
            assert rows[tname]["kind"].endswith("exact") and rows[tname]["rel_err"] == 0.0
            assert np.array_equal(
                np.ascontiguousarray(got).view(np.uint32), want.astype(np.float32).view(np.uint32)
            ), tname
            # bytes kept: the same as the file's, but for INT4's float32 scales
            if EXPECTED.get(name, "gguf") != "int4":
                assert rows[tname]["bytes_out"] == rows[tname]["bytes_in"] == blocks.nbytes
    assert main(["inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert "int4_asym of blk.0.q4_1.weight [4x512], group 32: packed codes" in table
    assert "gguf q6_k of blk.0.q6_k.weight [4x512]: ggml blocks" in table
    assert "gguf q8_0 of token_embd.weight [16x64]" in table


def test_gguf_type_without_quantrs_type_is_refused(tmp_path, capsys):
    # IQ4_NL: 32 weights in 18 bytes; no quantrs type holds it, and there is no decoder
    blocks = np.zeros((2, 2 * 18), np.uint8)
    path = tmp_path / "iq.gguf"
    write_file(path, [("blk.0.ffn_up.weight", "IQ4_NL", blocks, (2, 64))])
    out = tmp_path / "out.safetensors"
    for extra in ([], ["--requantize"]):
        argv = ["convert", str(path), str(out), "--from", "gguf", "--no-progress", *extra]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert "'blk.0.ffn_up.weight'" in err and "IQ4_NL" in err and not out.exists()


@pytest.mark.parametrize("source", ["gptq", "awq"])
def test_zero_point_layers_convert_to_int_zp_exactly(tmp_path, capsys, source):
    rng = np.random.default_rng(3)
    in_f, out_f, gs = 128, 16, 32
    q = zp.every_code((in_f, out_f), 4, rng)
    zeros = zp.zeros_with_edges((in_f // gs, out_f), 4, rng)
    scales = (rng.standard_normal((in_f // gs, out_f)) * 0.02).astype(np.float16)
    if source == "gptq":  # v1, act-order
        g_idx = zp.desc_act_g_idx(in_f, gs, rng)
        t = {"qweight": zp.pack_along_rows(q, 4), "qzeros": zp.pack_along_cols(zeros - 1, 4),
             "scales": scales, "g_idx": g_idx}  # fmt: skip
        cfg = {"quant_method": "gptq", "bits": 4, "group_size": gs, "desc_act": True}
    else:
        g_idx = np.arange(in_f) // gs
        t = {"qweight": zp.pack_along_cols(q, 4, zp.AWQ_ORDER),
             "qzeros": zp.pack_along_cols(zeros, 4, zp.AWQ_ORDER), "scales": scales}  # fmt: skip
        cfg = {"quant_method": "awq", "bits": 4, "group_size": gs, "version": "gemm"}
    t["bias"] = rng.standard_normal(out_f).astype(np.float32)
    folder = zp.write_checkpoint(tmp_path / "m", cfg, {f"l.{k}": v for k, v in t.items()})
    assert main(["inspect", folder]) == 0
    assert f"{source} 4-bit, group 32" in capsys.readouterr().out
    out = tmp_path / "out.safetensors"
    argv = ["convert", folder, str(out), "--from", source, "--no-progress", "--json"]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["l"]["kind"] == "int_zp exact"
    want = zp.reference(q, scales, zeros, g_idx).T  # [out, in], the producers' formula
    with Checkpoint(out) as ck:
        w = read_own(ck, "l.weight", ALL_FORMATS)
        assert isinstance(w, quantrs.IntZpWeight) and (w.perm is not None) == (source == "gptq")
        assert np.array_equal(w.dequantize().view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(ck.float32("l.bias"), t["bias"])
    assert main(["inspect", str(out)]) == 0
    assert "int_zp of l.weight [16x128], group 32, 4-bit: zero points" in capsys.readouterr().out


def test_convert_help_says_what_is_kept(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("Q4_1", "int4_asym", "int_zp", "Q8_0", "k-quants", "--requantize"):
        assert words in text


def test_gguf_round_trip_through_quantrs_keeps_every_byte(tmp_path):
    """GGUF -> quantrs layout -> ``save_gguf``: Q4_0 <-> INT4 g32, Q4_1 <-> int4_asym g32
    and the other block types come back as the very same bytes (the gguf package reads
    them)."""
    from quantrs.formats import save_gguf

    path, tensors = _gguf_file(tmp_path)
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), str(out), "--from", "gguf", "--no-progress"]) == 0
    with Checkpoint(out) as ck:
        weights = {t[0]: read_own(ck, t[0], ALL_FORMATS) for t in tensors}
    rows = save_gguf(tmp_path / "back.gguf", weights)
    assert all(r["rel_err"] == 0.0 and r["scales_changed"] == 0 for r in rows)
    back = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "back.gguf")).tensors}
    for tname, name, blocks, _shape in tensors:
        assert back[tname].tensor_type.name == name
        np.testing.assert_array_equal(np.asarray(back[tname].data).reshape(blocks.shape), blocks)


def test_save_gguf_refuses_what_it_cannot_hold(tmp_path):
    from quantrs.formats import UnsupportedFormatError, save_gguf

    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    with pytest.raises(UnsupportedFormatError, match="'a'.*group size 32.*group 64"):
        save_gguf(tmp_path / "x.gguf", {"a": quantrs.Int4AsymWeight.quantize(w, group_size=64)})
    with pytest.raises(UnsupportedFormatError, match="'b'.*ndarray"):
        save_gguf(tmp_path / "x.gguf", {"b": w})
    assert not (tmp_path / "x.gguf").exists()


def _random_int4_k(out: int, inf: int, seed: int):
    """An ``Int4KWeight`` from random parts: every code, every 6-bit step / minimum,
    finite halves of both signs."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (out, inf), dtype=np.uint8)
    codes[0, :512] = np.arange(512) % 16  # every code at every lane parity
    scale_codes = rng.integers(0, 64, (out, inf // 32, 2), dtype=np.uint8)
    scale_codes[0, :8, 0], scale_codes[0, :8, 1] = [0, 63, 15, 16, 47, 48, 1, 62], 63
    halves = (rng.standard_normal((out, inf // 256, 2)) * 1e-2).astype(np.float16)
    return quantrs.Int4KWeight.from_parts(codes, scale_codes, halves.astype(np.float32))


@pytest.mark.parametrize("source", ["parts", "quantized"])
def test_save_gguf_writes_int4_k_as_q4_k_exactly(tmp_path, source):
    """``Int4KWeight`` (super-blocks of 256) -> ``Q4_K``: the ``gguf`` package's dequantizer
    gives ``Int4KWeight.dequantize()`` bit for bit, and quantrs reads the block back as the
    same values."""
    from quantrs.formats import save_gguf

    if source == "parts":
        k = _random_int4_k(6, 768, seed=3)
    else:
        w = np.random.default_rng(4).standard_normal((6, 512)).astype(np.float32)
        k = quantrs.Int4KWeight.quantize(w)
    rows = save_gguf(tmp_path / "k.gguf", {"blk.0.ffn_up.weight": k})
    assert rows[0]["type"] == "Q4_K" and rows[0]["rel_err"] == 0.0
    (t,) = gguf.GGUFReader(str(tmp_path / "k.gguf")).tensors
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_K
    got = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_K).reshape(k.shape)
    want = k.dequantize()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    back = quantrs.GgufWeight.from_bytes("q4_k", k.shape, np.asarray(t.data).reshape(-1))
    assert np.array_equal(back.dequantize(), want)


def test_save_gguf_refuses_int4_k_without_256_super_blocks(tmp_path):
    from quantrs.formats import UnsupportedFormatError, save_gguf

    w = np.random.default_rng(0).standard_normal((4, 576)).astype(np.float32)
    with pytest.raises(UnsupportedFormatError, match="'a'.*super-blocks of 256.*576"):
        save_gguf(tmp_path / "x.gguf", {"a": quantrs.Int4KWeight.quantize(w)})
    assert not (tmp_path / "x.gguf").exists()
