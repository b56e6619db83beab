"""peft LoRA on quantrs' quantized layers: the adapters' gradients equal LoRA's on the
float model whose weights are the dequantized ones (peft itself is the reference)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import quantrs
import quantrs.torch as qt

peft = pytest.importorskip("peft")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.q_proj, self.v_proj = nn.Linear(64, 96), nn.Linear(96, 64)

    def forward(self, x):
        return self.v_proj(torch.relu(self.q_proj(self.norm(x))))


def _dequantized_float(qmodel: nn.Module, float_model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(float_model)
    for name in ("q_proj", "v_proj"):
        q, lin = getattr(qmodel, name), getattr(ref, name)
        with torch.no_grad():
            lin.weight.copy_(q.dequantize())
            lin.bias.copy_(q.bias)
    return ref


def _lora(model: nn.Module, quantized: bool) -> nn.Module:
    cfg = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    if quantized:
        qt.peft_config(cfg)
    torch.manual_seed(7)  # the same adapter initialization on both sides
    return peft.get_peft_model(model, cfg)


@pytest.mark.parametrize(
    "method,gs", [("int4", 32), ("int4", 128), ("int8", 32), ("fp8", 32), ("int4_asym", 32)]
)
def test_lora_steps_match_lora_on_the_dequantized_float_model(method, gs):
    torch.manual_seed(0)
    base = _Block()
    qmodel = qt.quantize_(copy.deepcopy(base), method, gs)
    ref = _lora(_dequantized_float(qmodel, base), quantized=False)
    qlora = _lora(qmodel, quantized=True)
    opts = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.05)
        for m in (ref, qlora)
    ]
    x, target = torch.randn(8, 64), torch.randn(8, 64)
    for _ in range(3):
        grads = []
        for m, opt in zip((ref, qlora), opts):
            loss = nn.functional.mse_loss(m(x), target)
            opt.zero_grad()
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad})
            opt.step()
        assert grads[0].keys() == grads[1].keys() and any("lora_A" in n for n in grads[1])
        for n in grads[0]:
            torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-5)
    # only the adapters train; the packed weights are untouched buffers
    trainable = {n for n, p in qlora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_merge_refuses_clearly_and_unload_drops_adapters():
    qmodel = qt.quantize_(_Block(), "int4")
    qlora = _lora(qmodel, quantized=True)
    with pytest.raises(quantrs.UnsupportedOperation, match="merg"):
        qlora.merge_and_unload()
    plain = qlora.unload()
    assert isinstance(plain.q_proj, qt.Int4Linear)


def test_peft_config_refuses_other_objects():
    with pytest.raises(TypeError, match="LoraConfig"):
        qt.peft_config(object())


@pytest.mark.parametrize("method", ["int4", "int8", "fp8", "int4_asym"])
def test_a_qlora_step_keeps_no_float_copy_of_the_frozen_weights(method):
    """What autograd saves for the backward, and what the model holds, contain no float
    tensor of a frozen weight's size: the packed codes are all the base layers keep."""
    qlora = _lora(qt.quantize_(_Block(), method), quantized=True)
    sizes = {64 * 96}  # q_proj and v_proj weights: [96, 64] and [64, 96]
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = qlora(torch.randn(8, 64)).square().mean()
    loss.backward()
    assert saved and not [s for s in saved if s[0].is_floating_point and s[1] in sizes]
    held = list(qlora.parameters()) + list(qlora.buffers())
    assert not [t for t in held if t.is_floating_point() and t.numel() in sizes]
    assert any(not t.is_floating_point() and t.numel() >= 64 * 96 // 2 for t in held)


@pytest.mark.parametrize("method", ["int4", "int8", "fp8", "int4_asym"])
def test_peft_wraps_bias_free_quantized_layers(method):
    """Llama's projections have no bias: peft finds the base layer's device without one."""
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 96, bias=False))
    qt.quantize_(model, method, filter_fn=lambda m, fqn: fqn == "1")
    cfg = qt.peft_config(peft.LoraConfig(r=4, target_modules=["1"], init_lora_weights=False))
    lora = peft.get_peft_model(model, cfg)
    lora(torch.randn(4, 64)).square().mean().backward()
    grads = [p.grad for n, p in lora.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and torch.count_nonzero(g) > 0 for g in grads)
