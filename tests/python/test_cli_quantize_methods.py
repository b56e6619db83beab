"""``quantrs quantize`` with the quantizers ``quantize_`` has: ``--format int4_asym``
(search / rtn), ``--method search`` weighted by the importance of ``--calibration`` text,
and ``--method gptq``. The written tensors are decoded here from their bytes (``w = d q +
m`` from the stored halves and nibbles) and compared with the Python API run on the same
inputs; the output folder loads with ``quantrs.torch.load_pretrained``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import quantrs
from quantrs.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_llama import tiny_llama  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog. " * 40


def _decode_asym(codes: np.ndarray, scales: np.ndarray, gs: int) -> np.ndarray:
    """``d * q + m`` in float32 from the written bytes: per run of 32 inputs, byte ``j``
    holds input ``j`` (low nibble) and ``j + 16`` (high)."""
    out_f = codes.shape[0]
    r = codes.reshape(out_f, -1, 1, 16)
    q = np.concatenate([r & 0x0F, r >> 4], axis=2).reshape(out_f, -1).astype(np.float32)
    dm = scales.view(np.float16).astype(np.float32)  # [out, groups, 2]
    g = np.arange(q.shape[1]) // gs
    return dm[:, g, 0] * q + dm[:, g, 1]


def test_int4_asym_file(tmp_path, capsys):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 96)).astype(np.float32)
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"l.weight": w, "l.bias": np.ones(24, np.float32)}, str(src))
    argv = ["quantize", str(src), str(dst), "--format", "int4_asym", "--group-size", "32"]
    assert main([*argv, "--no-progress", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["l.weight"]
    t = load_file(str(dst))
    got = _decode_asym(t["l.weight.codes"], t["l.weight.scales"], 32)
    want = quantrs.Int4AsymWeight.quantize(w, group_size=32, method="search")
    np.testing.assert_array_equal(got, want.dequantize())
    rel = np.linalg.norm(got - w) / np.linalg.norm(w)
    assert row["kind"] == "int4_asym" and abs(row["rel_err"] - rel) < 1e-6 and rel < 0.12
    # 4 bits + two halves per 32 weights: 5 bits per weight
    assert row["bytes_out"] * 8 == 5 * w.size
    np.testing.assert_array_equal(t["l.bias"], np.ones(24, np.float32))


def test_bad_method_and_group_are_named(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    save_file({"l.weight": np.ones((4, 48), np.float32)}, str(src))
    out = str(tmp_path / "o.safetensors")
    base = ["quantize", str(src), out, "--no-progress"]
    cases = [
        (["--format", "int4_asym", "--method", "full"], "--method 'full' does not apply"),
        (["--format", "int4_asym", "--group-size", "48"], "multiple of 32 for int4_asym"),
        (["--format", "int4_asym"], "'l.weight': 48 inputs"),
        (["--format", "fp8", "--method", "rtn"], "does not apply to --format fp8"),
        (["--format", "int4", "--calibration", "x.txt"], "model folder"),
    ]
    for extra, msg in cases:
        assert main(base + extra) == 1
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def _folder(tmp_path):
    """A tiny Llama folder with a character-level tokenizer and calibration text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_llama(seed=6, tie=True)
    src = tmp_path / "float"
    model.save_pretrained(src)
    vocab = {chr(32 + i): i for i in range(95)} | {"[UNK]": 95}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(src)
    text = tmp_path / "calib.txt"
    text.write_text(TEXT)
    ids = torch.tensor([[vocab[c] for c in TEXT[:128]]])
    batches = [ids[:, :64], ids[:, 64:128]]  # what --calibration-length 64 cuts
    return model, src, text, batches


@pytest.mark.parametrize("fmt,method", [("int4_asym", "gptq"), ("int4", "gptq")])
def test_gptq_from_calibration_text(tmp_path, fmt, method):
    from quantrs.torch import GgufLinear, Int4Linear, load_pretrained, quantize_

    model, src, text, batches = _folder(tmp_path)
    out = tmp_path / "q"
    argv = ["quantize", str(src), str(out), "--format", fmt, "--method", method,
            "--calibration", str(text), "--calibration-windows", "2",
            "--calibration-length", "64", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (cfg["format"], cfg["method"], cfg["calibration"]["windows"]) == (fmt, method, 2)
    # the Python API on the same windows gives the same bits
    quantize_(model, fmt, 32, quantizer=method, calibration=batches)
    loaded = load_pretrained(out)
    cls = Int4Linear if fmt == "int4" else GgufLinear
    mods = {n: m for n, m in loaded.named_modules() if isinstance(m, cls)}
    assert len(mods) == 14
    for n, m in mods.items():
        want = model.get_submodule(n).dequantize()
        assert torch.equal(m.dequantize(), want), n
    ids = batches[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_search_weighted_by_calibration_importance(tmp_path):
    from quantrs.torch import collect_importance

    model, src, text, batches = _folder(tmp_path)
    out = tmp_path / "q"
    argv = ["quantize", str(src), str(out), "--format", "int4_asym", "--calibration",
            str(text), "--calibration-windows", "2", "--calibration-length", "64",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    imp = collect_importance(
        model, batches, lambda m, n: isinstance(m, torch.nn.Linear) and n != "lm_head"
    )
    t = load_file(str(out / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    w = model.get_submodule(name).weight.detach().numpy()
    want = quantrs.Int4AsymWeight.quantize(w, group_size=32, importance=imp[name])
    got = _decode_asym(t[f"{name}.weight.codes"], t[f"{name}.weight.scales"], 32)
    np.testing.assert_array_equal(got, want.dequantize())
    plain = quantrs.Int4AsymWeight.quantize(w, group_size=32).dequantize()
    assert not np.array_equal(got, plain)  # the importance changed the choice


def test_bad_calibration_is_named(tmp_path, capsys):
    _, src, text, _ = _folder(tmp_path)
    out = tmp_path / "q"
    base = ["quantize", str(src), str(out), "--format", "int4_asym", "--no-progress"]
    cases = [
        (["--method", "gptq"], "--method gptq needs --calibration"),
        (["--calibration", str(tmp_path / "none.txt")], "cannot read it as text"),
        (["--calibration", str(text), "--calibration-length", "100000"], "fewer than one window"),
        (["--format", "fp8", "--calibration", str(text)], "not --format fp8"),
    ]
    for extra, msg in cases:
        assert main(base + extra) == 1
        assert msg in capsys.readouterr().err
    assert not out.exists()
