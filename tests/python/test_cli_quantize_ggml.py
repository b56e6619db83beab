"""``quantrs quantize --format q4_0 ... q6_k``: the written ``.blocks`` are the bytes of
``GgufWeight.quantize`` (and, for the legacy types, of ``gguf.quants.quantize``, the
independent reference), decoded by ``gguf.quants.dequantize`` bit for bit as quantrs reads
them back; widths the type's block does not divide take llama.cpp's fallback or stay
float, each named in the report; calibration importance weighs the quantizer; the output
folder loads with ``quantrs.torch.load_pretrained``; bad options raise naming them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import quantrs
from quantrs import GgufWeight
from quantrs.cli import CliError, main
from quantrs.formats import Checkpoint
from quantrs.formats.own_layout import ALL_FORMATS, read_own

gguf = pytest.importorskip("gguf")

TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
# llama.cpp's tensor_type_fallback (src/llama-quant.cpp), written out here on its own
FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}


def _file(tmp_path):
    rng = np.random.default_rng(3)
    t = {
        "a.weight": rng.standard_normal((6, 512)).astype(np.float32),  # every type fits
        "b.weight": rng.standard_normal((5, 96)).astype(np.float32),  # k-quants fall back
        "c.weight": rng.standard_normal((4, 40)).astype(np.float32),  # no block fits
        "a.bias": rng.standard_normal(6).astype(np.float32),
    }
    src = tmp_path / "in.safetensors"
    save_file(t, str(src))
    return src, t


@pytest.mark.parametrize("gtype", TYPES)
def test_each_type_writes_ggml_bytes_and_falls_back_as_llama_cpp(tmp_path, capsys, gtype):
    src, t = _file(tmp_path)
    out = tmp_path / "out.safetensors"
    argv = ["quantize", str(src), str(out), "--format", gtype, "--no-progress", "--json"]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    got = load_file(str(out))
    fb = FALLBACK.get(gtype, gtype)
    for name, want_type in (("a.weight", gtype), ("b.weight", fb)):
        w = t[name]
        blocks = got[name + ".blocks"]
        want = np.asarray(GgufWeight.quantize(w, want_type).to_bytes()).reshape(w.shape[0], -1)
        np.testing.assert_array_equal(blocks, want)
        qt = gguf.GGMLQuantizationType[want_type.upper()]
        if not want_type.endswith("_k"):  # gguf.quants has the legacy quantizers only
            np.testing.assert_array_equal(blocks, gguf.quants.quantize(w, qt))
        with Checkpoint(out) as ck:
            back = read_own(ck, name, ALL_FORMATS)
        assert (back.type, back.shape) == (want_type, w.shape)
        ref = gguf.quants.dequantize(blocks, qt).astype(np.float32)
        assert np.array_equal(back.dequantize().view(np.uint32), ref.view(np.uint32)), name
        assert rows[name]["kind"] == f"gguf {want_type}"
        assert rows[name]["bytes_out"] == blocks.nbytes
        rel = np.linalg.norm(w - ref) / np.linalg.norm(w)
        assert rows[name]["rel_err"] == pytest.approx(rel, rel=1e-3)
    assert rows["a.weight"]["reason"] is None
    note = rows["b.weight"]["reason"]
    assert (note is None) == (gtype not in FALLBACK)
    if note:
        assert f"{gtype} fallback" in note and "96 inputs" in note and "256" in note
    # 40 inputs: no ggml block divides them; the float weight is copied unchanged
    assert rows["c.weight"]["kind"] == "copy" and "multiple of 32" in rows["c.weight"]["reason"]
    np.testing.assert_array_equal(got["c.weight"], t["c.weight"])
    np.testing.assert_array_equal(got["a.bias"], t["a.bias"])
    with Checkpoint(out) as ck:
        meta = ck.reader("a.weight.blocks").metadata
    assert meta["quantrs.format"] == gtype


def test_bad_options_are_named(tmp_path, capsys):
    src, _ = _file(tmp_path)
    out = tmp_path / "o.safetensors"
    for extra, msg in [
        (["--format", "q4_k", "--group-size", "64"], "--group-size does not apply"),
        (["--format", "q5_0", "--method", "search"], "--method 'search' does not apply"),
        (["--format", "q4_k", "--method", "ggml"], None),
        (["--format", "int4", "--method", "ggml"], "--method 'ggml' does not apply"),
    ]:
        rc = main(["quantize", str(src), str(out), *extra, "--no-progress"])
        err = capsys.readouterr().err
        assert rc == (0 if msg is None else 1), extra
        if msg:
            assert msg in err, err
    out.unlink()
    assert main(["quantize", str(src), str(tmp_path / "o.gguf"), "--format", "q4_0"]) == 1
    assert "convert_hf_to_gguf.py" in capsys.readouterr().err
    assert not (tmp_path / "o.gguf").exists()
    with pytest.raises(SystemExit):  # argparse: not a known format
        main(["quantize", str(src), str(out), "--format", "q3_k"])
    assert "invalid choice: 'q3_k'" in capsys.readouterr().err


def test_bad_importance_is_named(tmp_path):
    from quantrs.cli._prepared import Prepared
    from quantrs.cli._quantize import quantize_file

    src, _ = _file(tmp_path)
    bad = Prepared(importance={"a.weight": np.ones(3, np.float32)})
    with pytest.raises(CliError, match=r"'a.weight'.*importance") as e:
        quantize_file(src, tmp_path / "o.safetensors", "q4_k", progress=False, prepared=bad)
    assert isinstance(e.value, quantrs.QuantError)
    assert not (tmp_path / "o.safetensors").exists()


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_folder_with_calibration_loads_and_equals_quantize_(tmp_path):
    """A tiny Llama (inputs 64 and 128): q4_0 with calibration importance equals
    ``GgufWeight.quantize`` with ``collect_importance``'s numbers and ``quantize_`` with
    the same batches; q4_k falls back to q5_0 everywhere. Both folders load."""
    from test_cli_quantize_methods import _folder

    from quantrs.torch import GgufLinear, collect_importance, load_pretrained, quantize_

    model, src, text, batches = _folder(tmp_path)
    imp = collect_importance(
        model, batches, lambda m, n: isinstance(m, torch.nn.Linear) and n != "lm_head"
    )
    cal = ["--calibration", str(text), "--calibration-windows", "2", "--calibration-length", "64"]
    moved = 0  # layers whose bytes the importance changed
    for gtype, used, extra in (("q4_0", "q4_0", cal), ("q4_k", "q5_0", [])):
        out = tmp_path / gtype
        argv = ["quantize", str(src), str(out), "--format", gtype, *extra, "--no-progress"]
        assert main(argv) == 0
        cfg = json.loads((out / "config.json").read_text())["quantization_config"]
        assert (cfg["format"], cfg["method"]) == (gtype, "ggml")
        t = load_file(str(out / "model.safetensors"))
        loaded = load_pretrained(out)
        mods = {n: m for n, m in loaded.named_modules() if isinstance(m, GgufLinear)}
        assert len(mods) == 14 and {m.weight_type for m in mods.values()} == {used}
        for n, m in mods.items():
            w = model.get_submodule(n).weight.detach().numpy()
            want = GgufWeight.quantize(w, used, importance=imp[n] if extra else None)
            want_bytes = np.asarray(want.to_bytes()).reshape(w.shape[0], -1)
            np.testing.assert_array_equal(t[f"{n}.weight.blocks"], want_bytes)
            np.testing.assert_array_equal(m.qweight.numpy(), want_bytes)
            plain = np.asarray(GgufWeight.quantize(w, used).to_bytes()).reshape(w.shape[0], -1)
            moved += bool(extra) and not np.array_equal(want_bytes, plain)
        ref = quantize_(load_pretrained(src), gtype, calibration=batches if extra else None)
        ids = batches[0]
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, ref(ids).logits, rtol=0, atol=0)
    assert moved > 0
