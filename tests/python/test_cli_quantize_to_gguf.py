"""``quantrs quantize IN.gguf OUT.gguf --format TYPE``: the output, read by the ``gguf``
package, keeps every key/value of IN (``general.file_type`` and
``general.quantization_version`` set as llama.cpp sets them), copies the tensors it does
not quantize byte for byte with their type, and holds for the block linears the bytes of
``GgufWeight.quantize`` on the input as ``gguf.quants.dequantize`` decodes it (for the
legacy types also the bytes of ``gguf.quants.quantize``), with llama.cpp's fallback types,
GGUF's order and alignment; bad inputs stop naming the problem and leave no file.
The llama.cpp end-to-end check is in ``test_cli_quantize_to_gguf_llama_cpp.py``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from quantrs import GgufWeight
from quantrs.cli import main
from quantrs.formats import GgufFile

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
# llama.cpp's tensor_type_fallback (src/llama-quant.cpp), written out here on its own
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
# llama.cpp's llama_ftype per --format, from gguf-py's own enum
FILE_TYPE = {
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "q5_k": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
}
# the largest relative Frobenius error of these random-normal weights per type (measured
# 0.087 / 0.078 / 0.043 / 0.045 / 0.0054 / 0.072 / 0.036 / 0.018), with 1.3x of room
MAX_REL_ERR = {"q4_0": 0.11, "q4_1": 0.10, "q5_0": 0.056, "q5_1": 0.058, "q8_0": 0.007,
               "q4_k": 0.094, "q5_k": 0.047, "q6_k": 0.024}  # fmt: skip
# the chosen tensors: GGUF name -> (shape [out, in], stored ggml type)
LINEARS = {
    "blk.0.attn_q.weight": ((256, 256), "F32"),
    "blk.0.attn_k.weight": ((128, 256), "F16"),
    "blk.0.attn_v.weight": ((128, 256), "Q4_1"),
    "blk.0.attn_output.weight": ((256, 256), "Q4_K"),
    "blk.0.ffn_gate.weight": ((288, 256), "BF16"),
    "blk.0.ffn_up.weight": ((288, 256), "F32"),
    "blk.0.ffn_down.weight": ((256, 288), "F32"),  # 288 inputs: the k-quants fall back
    "blk.0.ffn_extra.weight": ((8, 40), "F32"),  # 40 inputs: no block fits, kept float
}
COPIED = {
    "token_embd.weight": ((64, 256), "Q8_0"),
    "blk.0.attn_norm.weight": ((256,), "F32"),
    "blk.0.ffn_norm.weight": ((256,), "F32"),
    "output_norm.weight": ((256,), "F32"),
    "output.weight": ((64, 256), "F16"),
}
ORDER = [
    "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
    "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
    "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight", "blk.0.ffn_extra.weight", "output_norm.weight", "output.weight",
]  # fmt: skip


def _stored(w: np.ndarray, kind: str):
    """``(array for GGUFWriter.add_tensor, raw ggml type or None)``."""
    if kind == "F32":
        return w, None
    if kind == "F16":
        return w.astype(np.float16), None
    if kind == "Q4_K":  # gguf.quants has no k-quant quantizer
        blocks = np.asarray(GgufWeight.quantize(w, "q4_k").to_bytes())
        return blocks.reshape(w.shape[0], -1), Q[kind]
    return gguf.quants.quantize(w, Q[kind]), Q[kind]


def write_model(path, *, alignment: int | None = None, nan_in: str | None = None, seed=0):
    """A one-block Llama-named model with metadata of every value kind; returns
    ``{name: float32 reference}`` (the values as written, before any rounding)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_block_count(1)
    w.add_feed_forward_length(288)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(64)])
    w.add_token_types([1] * 64)
    w.add_token_merges(["t o", "to k"])
    w.add_bos_token_id(1)
    w.add_bool("quantrs.test.flag", True)
    w.add_uint64("quantrs.test.u64", 2**40 + 3)
    w.add_int8("quantrs.test.i8", -5)
    w.add_float64("quantrs.test.f64", 0.125)
    w.add_array("quantrs.test.floats", [0.5, -1.25, 3.0])
    if alignment is not None:
        w.add_custom_alignment(alignment)
    ref = {}
    for name in ORDER:
        shape, kind = {**LINEARS, **COPIED}[name]
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1:
            x = 1 + 0.1 * x
        if name == nan_in:
            x[1, 3] = np.nan
        arr, raw = _stored(x, kind)
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=raw)
        ref[name] = x
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def _float(t) -> np.ndarray:
    """A tensor of a ``GGUFReader`` as float32 ``[out, in]``, decoded by gguf-py."""
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(
        [int(d) for d in reversed(t.shape)]
    )


def _expected_type(name: str, fmt: str) -> str | None:
    in_feat = LINEARS[name][0][1]
    for t in (fmt, FALLBACK.get(fmt)):
        if t is not None and in_feat % (256 if t.endswith("_k") else 32) == 0:
            return t
    return None


def _run(argv, capsys):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("fmt", TYPES)
def test_gguf_out_keeps_metadata_copies_and_quantizes(tmp_path, capsys, fmt):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_model(src)
    argv = ["quantize", str(src), str(out), "--format", fmt, "--no-progress", "--json"]
    rc, stdout, err = _run(argv, capsys)
    assert rc == 0, err
    report = json.loads(stdout)
    rows = {r["name"]: r for r in report["tensors"]}
    r_in, r_out = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))

    # every key/value of IN, same type and value; file_type and quantization_version set
    for key, f in r_in.fields.items():
        if key.startswith("GGUF."):
            continue
        g = r_out.fields[key]
        assert g.types == f.types, key
        if key != "general.file_type":
            assert g.contents() == f.contents(), key
    assert r_out.fields["general.file_type"].contents() == FILE_TYPE[fmt]
    assert r_out.fields["general.file_type"].types == [gguf.GGUFValueType.UINT32]
    assert r_out.fields["general.quantization_version"].contents() == 2
    extra = set(r_out.fields) - set(r_in.fields)
    assert extra == {"general.quantization_version"}
    assert report["file_type"] == FILE_TYPE[fmt]

    # tensor order, alignment
    assert [t.name for t in r_out.tensors] == ORDER
    assert all(t.data_offset % 32 == 0 for t in r_out.tensors)
    t_in = {t.name: t for t in r_in.tensors}
    t_out = {t.name: t for t in r_out.tensors}
    for name in COPIED:
        a, b = t_in[name], t_out[name]
        assert b.tensor_type == a.tensor_type, name
        assert list(b.shape) == list(a.shape), name
        assert bytes(b.data) == bytes(a.data), name
        assert rows[name]["kind"] == "copy"

    quantized = 0
    for name in LINEARS:
        a, b = t_in[name], t_out[name]
        want = _expected_type(name, fmt)
        assert list(b.shape) == list(a.shape), name
        if want is None or want == a.tensor_type.name.lower():  # kept / already that type
            assert b.tensor_type == a.tensor_type, name
            assert bytes(b.data) == bytes(a.data), name
            assert rows[name]["kind"] == "copy"
            assert rows[name]["reason"].startswith("40 inputs" if want is None else "already")
            continue
        quantized += 1
        assert b.tensor_type == Q[want.upper()], (name, b.tensor_type)
        w = _float(a)  # the input as gguf-py decodes it
        expect = np.asarray(GgufWeight.quantize(w, want).to_bytes())
        assert bytes(b.data) == expect.tobytes(), name
        if not want.endswith("_k"):  # the independent reference quantizer
            assert bytes(b.data) == gguf.quants.quantize(w, Q[want.upper()]).tobytes(), name
        back = _float(b)
        rel = np.linalg.norm(back - w) / np.linalg.norm(w)
        assert rel < MAX_REL_ERR[want], (name, want, rel)
        assert rows[name]["kind"] == f"gguf {want}"
        assert rows[name]["rel_err"] == pytest.approx(rel, rel=1e-3, abs=1e-6)
        if want != fmt:
            assert "fallback" in rows[name]["reason"]
    assert report["quantized"] == quantized > 0
    assert sorted(os.listdir(tmp_path)) == ["in.gguf", "out.gguf"]  # no temporary left


def test_input_alignment_is_kept(tmp_path, capsys):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_model(src, alignment=64)
    rc, _, err = _run(["quantize", str(src), str(out), "--format", "q4_0", "--no-progress"], capsys)
    assert rc == 0, err
    r = gguf.GGUFReader(str(out))
    assert r.alignment == 64
    assert r.fields["general.alignment"].contents() == 64
    assert r.data_offset % 64 == 0
    assert all(t.data_offset % 64 == 0 for t in r.tensors)
    with GgufFile(out) as g:  # quantrs' reader agrees, offsets in header order
        offsets = [t.offset - r.data_offset for t in g.tensors.values()]
    assert all(o % 64 == 0 for o in offsets) and offsets == sorted(offsets)


def test_include_and_exclude_use_gguf_names(tmp_path, capsys):
    src = tmp_path / "in.gguf"
    write_model(src)
    out1, out2 = tmp_path / "a.gguf", tmp_path / "b.gguf"
    base = ["--format", "q8_0", "--no-progress", "--json"]
    rc, stdout, err = _run(["quantize", str(src), str(out1), *base, "--exclude", "*ffn_*"], capsys)
    assert rc == 0, err
    kinds = {r["name"]: r["kind"] for r in json.loads(stdout)["tensors"]}
    assert kinds["blk.0.ffn_up.weight"] == "copy"
    assert kinds["blk.0.attn_q.weight"] == "gguf q8_0"
    argv = ["quantize", str(src), str(out2), *base, "--include", "output.*"]
    rc, stdout, err = _run(argv, capsys)
    assert rc == 0, err
    rows = json.loads(stdout)["tensors"]
    assert [r["name"] for r in rows if r["kind"] != "copy"] == ["output.weight"]
    t = {t.name: t for t in gguf.GGUFReader(str(out2)).tensors}
    assert t["output.weight"].tensor_type == Q.Q8_0
    assert t["blk.0.attn_q.weight"].tensor_type == Q.F32


def test_refused_options_leave_no_file(tmp_path, capsys):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_model(src)
    for extra, msg in [
        (["--format", "int4"], "--format 'int4' cannot be written to a .gguf OUT"),
        (["--format", "fp8"], "expected a ggml block type (q4_0, q4_1"),
        (["--format", "q4_k", "--group-size", "64"], "--group-size does not apply"),
        (["--format", "q4_0", "--method", "search"], "--method 'search' does not apply"),
    ]:
        rc, _, err = _run(["quantize", str(src), str(out), *extra, "--no-progress"], capsys)
        assert rc == 1 and msg in err, (extra, err)
    with pytest.raises(SystemExit) as e:  # argparse: not a known format
        main(["quantize", str(src), str(out), "--format", "q3_k"])
    assert e.value.code == 2 and "invalid choice: 'q3_k'" in capsys.readouterr().err
    # GGUF in, safetensors out: refused, naming what to use
    rc, _, err = _run(["quantize", str(src), str(tmp_path / "o.safetensors"), "--format",
                       "q4_0"], capsys)  # fmt: skip
    assert rc == 1 and "OUT must end in .gguf" in err and "quantrs convert" in err
    assert sorted(os.listdir(tmp_path)) == ["in.gguf"]


def test_missing_output_dir_and_bad_input(tmp_path, capsys):
    src = tmp_path / "in.gguf"
    write_model(src)
    rc, _, err = _run(["quantize", str(src), str(tmp_path / "no" / "o.gguf"), "--format",
                       "q4_0"], capsys)  # fmt: skip
    assert rc == 1 and "output directory" in err and "does not exist" in err
    out = tmp_path / "out.gguf"
    rc, _, err = _run(["quantize", str(tmp_path / "none.gguf"), str(out), "--format", "q4_0"],
                      capsys)  # fmt: skip
    assert rc == 1 and "none.gguf: no such file" in err
    data = src.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])  # the last tensor's bytes are missing
    rc, _, err = _run(["quantize", str(cut), str(out), "--format", "q4_0"], capsys)
    assert rc == 1 and "not a valid GGUF file" in err and "'output.weight'" in err
    assert "truncated" in err
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUX" + data[4:])
    rc, _, err = _run(["quantize", str(junk), str(out), "--format", "q4_0"], capsys)
    assert rc == 1 and "bad magic" in err
    assert sorted(os.listdir(tmp_path)) == ["cut.gguf", "in.gguf", "junk.gguf"]


def test_nan_weight_names_the_tensor_and_keeps_an_existing_out(tmp_path, capsys):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_model(src, nan_in="blk.0.ffn_up.weight")
    out.write_bytes(b"old contents")
    rc, _, err = _run(["quantize", str(src), str(out), "--format", "q4_0"], capsys)
    assert rc == 1, err
    assert "tensor 'blk.0.ffn_up.weight'" in err and "non-finite" in err and "[1, 3]" in err
    assert out.read_bytes() == b"old contents"
    assert sorted(os.listdir(tmp_path)) == ["in.gguf", "out.gguf"]


def test_hf_inputs_with_gguf_out_name_the_converter(tmp_path, capsys):
    st = tmp_path / "model.safetensors"
    save_file({"a.weight": np.ones((4, 32), np.float32)}, str(st))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for src in (st, folder):
        rc, _, err = _run(["quantize", str(src), str(tmp_path / "o.gguf"), "--format", "q4_0"],
                          capsys)  # fmt: skip
        assert rc == 1, err
        assert "convert_hf_to_gguf.py" in err and "quantrs quantize model-f32.gguf" in err
    assert "is a model folder" in err
    assert not (tmp_path / "o.gguf").exists()


def test_non_finite_block_scale_in_a_chosen_tensor_is_named(tmp_path, capsys):
    src, out = tmp_path / "in.gguf", tmp_path / "out.gguf"
    write_model(src)
    t = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}["blk.0.attn_v.weight"]
    data = bytearray(src.read_bytes())
    data[t.data_offset : t.data_offset + 2] = np.float16(np.inf).tobytes()  # block 0's d
    src.write_bytes(bytes(data))
    rc, _, err = _run(["quantize", str(src), str(out), "--format", "q8_0"], capsys)
    assert rc == 1 and "tensor 'blk.0.attn_v.weight'" in err and "scale inf" in err, err
    assert err.count("blk.0.attn_v") == 1
    assert sorted(os.listdir(tmp_path)) == ["in.gguf"]
