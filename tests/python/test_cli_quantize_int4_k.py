"""``quantrs quantize --format int4_k``: the written tensors decoded here from their bytes
(nibbles, 6-bit codes four in three bytes, half super-block scales: ``w = (D sc) q -
Dmin mn``) against ``Int4KWeight.quantize`` on the same weight; the size is 4.5 bits per
weight; ``quantrs inspect`` names the parts; a model folder loads with
``quantrs.torch.load_pretrained``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import quantrs
from quantrs.cli import main


def _decode_k(codes: np.ndarray, six: np.ndarray, supers: np.ndarray) -> np.ndarray:
    out_f, half = codes.shape
    in_f = 2 * half
    r = codes.reshape(out_f, -1, 1, 16)
    q = np.concatenate([r & 0x0F, r >> 4], axis=2).reshape(out_f, in_f).astype(np.float32)
    bits = np.unpackbits(six[:, :, None], axis=2, bitorder="little").reshape(out_f, -1)
    assert not bits[:, (in_f // 32) * 12 :].any()  # padding
    vals = bits[:, : (in_f // 32) * 12].reshape(out_f, -1, 6) @ (1 << np.arange(6))
    sc, mn = vals.reshape(out_f, -1, 2).transpose(2, 0, 1).astype(np.float32)
    sup = supers.view(np.float16).astype(np.float32)  # [out, supers, 2]
    per = (in_f // 32) // sup.shape[1]
    g = np.arange(in_f) // 32
    d, dmin = sup[:, g // per, 0] * sc[:, g], sup[:, g // per, 1] * mn[:, g]
    return d * q - dmin


@pytest.mark.parametrize("in_f", [256, 96])
def test_int4_k_file(tmp_path, capsys, in_f):
    w = np.random.default_rng(in_f).standard_normal((24, in_f)).astype(np.float32)
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"l.weight": w, "l.bias": np.ones(24, np.float32)}, str(src))
    argv = ["quantize", str(src), str(dst), "--format", "int4_k", "--no-progress", "--json"]
    assert main(argv) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["l.weight"]
    t = load_file(str(dst))
    got = _decode_k(t["l.weight.codes"], t["l.weight.scale_codes"], t["l.weight.supers"])
    want = quantrs.Int4KWeight.quantize(w, method="search")
    np.testing.assert_array_equal(got, want.dequantize())
    rel = np.linalg.norm(got - w) / np.linalg.norm(w)
    assert row["kind"] == "int4_k" and abs(row["rel_err"] - rel) < 1e-6 and rel < 0.12
    # 4 bits + two 6-bit codes per 32 weights + two halves per super-block, the bytes of
    # each row's codes rounded up: the format's own size, 4.5 bits per weight at 256
    assert row["bytes_out"] == want.nbytes
    if in_f == 256:
        assert row["bytes_out"] * 8 == 4.5 * w.size
    np.testing.assert_array_equal(t["l.bias"], np.ones(24, np.float32))
    # --method rtn writes the other quantizer
    rtn = tmp_path / "rtn.safetensors"
    assert main(["quantize", str(src), str(rtn), "--format", "int4_k", "--method", "rtn",
                 "--no-progress"]) == 0  # fmt: skip
    t = load_file(str(rtn))
    got = _decode_k(t["l.weight.codes"], t["l.weight.scale_codes"], t["l.weight.supers"])
    np.testing.assert_array_equal(got, quantrs.Int4KWeight.quantize(w, method="rtn").dequantize())
    capsys.readouterr()
    assert main(["inspect", str(dst)]) == 0
    shown = capsys.readouterr().out
    assert "int4_k of l.weight" in shown and "6-bit step and minimum codes" in shown


def test_bad_options_are_named(tmp_path, capsys):
    src = tmp_path / "in.safetensors"
    save_file({"l.weight": np.ones((4, 48), np.float32)}, str(src))
    base = ["quantize", str(src), str(tmp_path / "o.safetensors"), "--no-progress"]
    cases = [
        (["--format", "int4_k", "--method", "full"], "--method 'full' does not apply"),
        (["--format", "int4_k", "--group-size", "64"], "--group-size must be 32 for int4_k"),
        (["--format", "int4_k"], "'l.weight': 48 inputs, int4_k needs a multiple of 32"),
    ]
    for extra, msg in cases:
        assert main(base + extra) == 1
        assert msg in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def test_folder_loads_and_calibrated_gptq(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_cli_quantize_methods import _folder

    from quantrs.torch import GgufLinear, load_pretrained, quantize_

    model, src, text, batches = _folder(tmp_path)
    out = tmp_path / "q"
    argv = ["quantize", str(src), str(out), "--format", "int4_k", "--method", "gptq",
            "--calibration", str(text), "--calibration-windows", "2",
            "--calibration-length", "64", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (cfg["format"], cfg["method"]) == ("int4_k", "gptq")
    quantize_(model, "int4_k", quantizer="gptq", calibration=batches)
    loaded = load_pretrained(out)
    mods = {n: m for n, m in loaded.named_modules() if isinstance(m, GgufLinear)}
    assert len(mods) == 14
    for n, m in mods.items():
        assert m.weight_packed.type == "int4_k"
        assert torch.equal(m.dequantize(), model.get_submodule(n).dequantize()), n
