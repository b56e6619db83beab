"""``quantrs convert FILE.gguf FOLDER --from gguf`` writes a model folder that
``quantrs.torch.load_pretrained`` loads: the same weights bit for bit and the same
logits as loading the GGUF file itself (files written by the ``gguf`` package)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from _tiny_gguf import write_tiny_gguf  # noqa: E402

from quantrs.cli import main  # noqa: E402
from quantrs.torch import GgufLinear, Int4Linear, load_pretrained  # noqa: E402


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _weights(model) -> dict[str, np.ndarray]:
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, (GgufLinear, Int4Linear)):
            out[name] = m.dequantize().detach().numpy()  # [out, in] for both
    return out


@pytest.mark.parametrize("arch,tie", [("llama", True), ("llama", False), ("qwen2", True)])
def test_converted_folder_loads_like_the_gguf_file(tmp_path, capsys, arch, tie):
    path = tmp_path / "m.gguf"
    kinds = write_tiny_gguf(path, arch, tie=tie)
    out = tmp_path / "out"
    assert main(["convert", str(path), str(out), "--from", "gguf", "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == arch
    assert all(r["kind"].endswith("exact") or r["kind"] == "copy" for r in report["tensors"])
    assert (out.stat().st_mode & 0o777) == 0o777 & ~_umask()  # not mkdtemp's 0700
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "quantrs"
    from_gguf, from_folder = load_pretrained(path), load_pretrained(out)
    got, want = _weights(from_folder), _weights(from_gguf)
    assert len(want) == len(kinds) + (0 if tie else 1)
    assert got.keys() == want.keys()
    for name in want:  # q / k rows put back in transformers' order, every bit kept
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Q4_0 became INT4 g32 (Int4Linear), Q4_1 int4_asym, the rest their ggml blocks
    n_q40 = sum(isinstance(m, Int4Linear) for m in from_folder.modules())
    assert n_q40 == kinds.count("Q4_0")
    np.testing.assert_array_equal(
        from_folder.model.embed_tokens.weight.detach().numpy(),
        from_gguf.model.embed_tokens.weight.detach().numpy(),
    )
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 53, 58, 95, 0]])
    with torch.no_grad():
        a, b = from_folder(ids).logits, from_gguf(ids).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_folder_output_refuses_an_existing_file(tmp_path, capsys):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama")
    out = tmp_path / "taken"
    out.write_text("x")
    assert main(["convert", str(path), str(out), "--from", "gguf", "--no-progress"]) == 1
    assert "is a file" in capsys.readouterr().err
    assert out.read_text() == "x"
