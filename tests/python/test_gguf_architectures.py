"""Whole GGUF models of each supported architecture (llama, qwen2, qwen3) load with
every block linear served from the file's bits: the logits equal transformers' own float
load of the same file (the gguf package's dequantization), and another architecture is
refused naming the supported ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
from _tiny_gguf import write_tiny_gguf  # noqa: E402

from quantrs.formats import UnsupportedFormatError  # noqa: E402
from quantrs.torch import GgufLinear, load_pretrained  # noqa: E402


def _reference(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()


@pytest.mark.parametrize(
    "arch,tie", [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", False)]
)
def test_gguf_architecture_loads_exactly(tmp_path, arch, tie):
    path = tmp_path / "m.gguf"
    kinds = write_tiny_gguf(path, arch, tie=tie)
    model = load_pretrained(path)
    ref = _reference(path)
    packed = {n: m for n, m in model.named_modules() if isinstance(m, GgufLinear)}
    # every block linear, and the head when it is its own tensor
    assert len(packed) == len(kinds) + (0 if tie else 1)
    assert sorted(m.weight_type for n, m in packed.items() if n != "lm_head") == sorted(
        k.lower() for k in kinds
    )
    ref_mods = dict(ref.named_modules())
    for name, m in packed.items():  # same values, q / k rows in transformers' order
        want = ref_mods[name].weight.detach().numpy()
        np.testing.assert_array_equal(m.dequantize().numpy(), want)
    ids = torch.tensor([[1, 5, 9, 17, 33, 64, 95, 2, 40, 41, 42, 7]])
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gguf_architecture_not_supported(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedFormatError, match="'phi2'.*'llama', 'qwen2', 'qwen3'"):
        load_pretrained(path)
