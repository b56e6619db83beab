"""The custom-operator checks shared by the PyTorch layer tests: no graph break, compiled
equals eager bit for bit (forward and input gradient), and ``torch.export`` holds the op."""

from __future__ import annotations

import torch


def assert_compiles_like_eager(m: torch.nn.Module, x: torch.Tensor, op: str) -> None:
    """``m`` captured in one graph; compiled == eager for the output and ``x``'s gradient;
    the exported graph calls a node whose name contains ``op``."""
    eager = m(x)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), eager)
    xg = x.clone().requires_grad_(True)
    compiled(xg).sum().backward()
    xr = x.clone().requires_grad_(True)
    m(xr).sum().backward()
    assert torch.equal(xg.grad, xr.grad)
    ep = torch.export.export(m, (x,))
    assert torch.equal(ep.module()(x), eager)
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(op in t for t in names), names


@torch.no_grad()
def assert_model_compiles_like_eager(model, ids: torch.Tensor, layer_names: tuple) -> None:
    """A transformers causal LM: no graph break whose reason names quantrs or one of
    ``layer_names``, and compiled logits equal eager's bit for bit."""
    eager = model(ids, use_cache=False).logits
    explain = torch._dynamo.explain(model)(ids, use_cache=False)
    reasons = [str(b.reason) for b in explain.break_reasons]
    ours = ("quantrs", *layer_names)
    assert not any(n in r for r in reasons for n in ours), reasons
    compiled = torch.compile(model, backend="aot_eager")(ids, use_cache=False).logits
    assert torch.equal(compiled, eager)
