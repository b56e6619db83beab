"""Calibration in ``quantrs.torch.quantize_`` (docs/torch.md "Calibration"): GPTQ on a
small transformers Llama built from a config, per-layer FP8 activation scales against
ranges recorded independently with torch hooks, and the bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _tiny_llama import tiny_llama  # noqa: E402

import quantrs  # noqa: E402
import quantrs.torch as qt  # noqa: E402

pytestmark = pytest.mark.kernel


def batches(n: int, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (1, 32), generator=g) for _ in range(n)]


def logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def block_linear_names(model) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and "layers" in n]


@pytest.mark.parametrize(("method", "cls"), [("int4", "Int4Linear"), ("int4_asym", "GgufLinear")])
def test_gptq_quantize_beats_the_same_grid_without_it(method, cls):
    float_model = tiny_llama()
    calib, held_out = batches(8), torch.cat(batches(4, seed=9))
    want = logits(float_model, held_out)
    errs = {}
    for quantizer, cal in (("search", calib), ("gptq", calib)):
        model = tiny_llama()
        qt.quantize_(model, method, group_size=32, quantizer=quantizer, calibration=cal)
        names = block_linear_names(tiny_llama())
        assert all(type(model.get_submodule(n)).__name__ == cls for n in names)
        errs[quantizer] = float((logits(model, held_out) - want).norm())
    assert errs["gptq"] < errs["search"]


def test_gptq_layers_hold_the_packed_weights_gptq_returns():
    """The first block's linears are quantized from the float model's own inputs: the
    Int4Linear buffers equal quantrs.gptq on the Hessian recorded here with torch hooks."""
    model, calib = tiny_llama(), batches(4)
    name = "model.layers.0.mlp.gate_proj"
    lin = model.get_submodule(name)
    w = lin.weight.detach().double().numpy().copy()
    xtx = torch.zeros(64, 64, dtype=torch.float64)

    def pre(_m, args):
        x = args[0].reshape(-1, 64).float()
        xtx.add_((x.T @ x).double())

    h = lin.register_forward_pre_hook(pre)
    for b in calib:
        logits(model, b)
    h.remove()
    want = quantrs.gptq(w, 2 * xtx.numpy(), format="int4", group_size=32)
    qt.quantize_(model, "int4", group_size=32, quantizer="gptq", calibration=calib)
    got = model.get_submodule(name)
    assert torch.equal(got.qweight, torch.from_numpy(np.array(want.data)))
    assert torch.equal(got.scales, torch.from_numpy(np.array(want.scales)))


def test_fp8_calibration_gives_each_layer_absmax_over_448():
    model, calib = tiny_llama(), batches(4)
    names = block_linear_names(model)
    seen = dict.fromkeys(names, 0.0)

    def hook(n):
        def pre(_m, args):
            seen[n] = max(seen[n], args[0].abs().max().item())

        return pre

    hs = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    for b in calib:
        logits(model, b)
    for h in hs:
        h.remove()
    ranges = qt.collect_activation_ranges(model, calib, lambda m, n: n in seen)
    assert ranges == pytest.approx(seen, rel=0, abs=0)
    qt.quantize_(model, "fp8", calibration=calib)
    for n in names:
        got = float(model.get_submodule(n).activation_scale)
        assert got == pytest.approx(np.float32(seen[n] / 448.0), rel=1e-7)
    assert len({float(model.get_submodule(n).activation_scale) for n in names}) > 1


def test_fp8_per_layer_scales_beat_one_global_scale():
    calib, held_out = batches(8), torch.cat(batches(4, seed=9))
    ref = tiny_llama()
    want = logits(ref, held_out)
    largest = max(qt.collect_activation_ranges(ref, calib, qt.default_filter).values())
    one = qt.quantize_(tiny_llama(), "fp8", activation_scale=largest / 448.0)
    per_layer = qt.quantize_(tiny_llama(), "fp8", calibration=calib)
    err_one = float((logits(one, held_out) - want).norm())
    err_per = float((logits(per_layer, held_out) - want).norm())
    assert err_per < err_one


def test_bad_calibration_inputs_raise_and_leave_the_model():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(quantrs.InvalidArgument, match="calibration: quantizer='gptq' needs"):
        qt.quantize_(model, "int4", quantizer="gptq")
    with pytest.raises(quantrs.InvalidArgument, match="calibration: expected at least one"):
        qt.quantize_(model, "int4", quantizer="gptq", calibration=[])
    with pytest.raises(TypeError, match="calibration: expected an iterable"):
        qt.quantize_(model, "fp8", calibration=3)
    with pytest.raises(quantrs.InvalidArgument, match="quantizer: 'gptq' applies to"):
        qt.quantize_(model, "fp8", quantizer="gptq", calibration=batches(1))
    with pytest.raises(quantrs.InvalidArgument, match="activation_scale or calibration"):
        qt.quantize_(model, "fp8", activation_scale=0.1, calibration=batches(1))
    with pytest.raises(quantrs.InvalidArgument, match="group_size"):
        qt.quantize_(model, "int4_asym", group_size=48, quantizer="gptq", calibration=batches(1))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(m) is not qt.Int4Linear for m in model.modules())


def test_block_inputs_carried_through_equal_full_model_reruns(monkeypatch):
    """The cached block-by-block pass (decoder layers of one ModuleList) quantizes every
    layer exactly as rerunning the whole model per block does (KV cache left out)."""
    from quantrs.torch import _gptq_blocks

    model = tiny_llama()
    linears = {n: model.get_submodule(n) for n in block_linear_names(model)}
    assert _gptq_blocks._chain(model, list(_gptq_blocks.blocks(linears))) is not None
    kw = dict(format="int4_asym", group_size=32, grid="search")
    carried = _gptq_blocks.gptq_weights(model, linears, batches(4), **kw)
    monkeypatch.setattr(_gptq_blocks, "_chain", lambda *_: None)
    rerun = _gptq_blocks.gptq_weights(model, linears, batches(4), **kw)
    for n in linears:
        assert np.array_equal(carried[n].codes(), rerun[n].codes()), n
        assert np.array_equal(carried[n].scales(), rerun[n].scales()), n


def test_calibration_text_makes_gptq_the_int4_default():
    """With calibration and no quantizer, "int4" / "int4_asym" use GPTQ; without
    calibration "int4" uses "search", and quantizer="rtn" the bit-identical old grid."""
    calib = batches(2)
    for method in ("int4", "int4_asym"):
        default = qt.quantize_(tiny_llama(), method, calibration=calib)
        gptq = qt.quantize_(tiny_llama(), method, quantizer="gptq", calibration=calib)
        for n in block_linear_names(tiny_llama()):
            a, b = default.get_submodule(n), gptq.get_submodule(n)
            assert torch.equal(a.dequantize(), b.dequantize()), n
    lin = tiny_llama().get_submodule("model.layers.0.mlp.up_proj")
    w = lin.weight.detach().t().contiguous().numpy()
    for quantizer, method in ((None, "search"), ("rtn", "rtn")):
        plain = qt.quantize_(tiny_llama(), "int4", quantizer=quantizer)
        want = quantrs.QuantizedWeight.quantize(w, method=method)
        got = plain.get_submodule("model.layers.0.mlp.up_proj").scales
        assert torch.equal(got, torch.from_numpy(np.array(want.scales))), method
