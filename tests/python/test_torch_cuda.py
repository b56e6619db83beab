"""CUDA tensors raise ``quantrs.CudaNotAvailable`` and change nothing (the CPU path is the
only one until the GPU path lands, docs/gpu.md).

No GPU is needed: torch's ``FakeTensorMode`` makes tensors that report a CUDA device
(shape, dtype and device only, no memory), which is all the checks look at. Where this
torch cannot make them, the tests skip with the reason.
"""

from __future__ import annotations

import pytest
import torch

import quantrs
import quantrs.torch as qt

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fake_cuda():
    """``make(shape)`` -> a float32 tensor on a (fake) CUDA device."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode()
        with mode:
            probe = torch.empty(2, device="cuda")
        assert probe.device.type == "cuda"
    except Exception as e:  # no fake CUDA device in this build
        pytest.skip(f"needs a CUDA device (fake CUDA tensors unavailable: {e})")

    def make(*shape: int) -> torch.Tensor:
        with mode:
            return torch.ones(*shape, device="cuda")

    def linear(i: int, o: int) -> torch.nn.Linear:
        with mode:
            return torch.nn.Linear(i, o, device="cuda")

    make.linear = linear  # type: ignore[attr-defined]
    return make


@pytest.mark.parametrize("cls", [qt.AdamW4bit, qt.Adam4bit])
def test_adam_step_with_a_cuda_parameter_changes_nothing(cls, fake_cuda):
    cpu = torch.nn.Parameter(torch.randn(32))
    gpu = torch.nn.Parameter(fake_cuda(32))
    opt = cls([cpu, gpu], lr=0.1)
    cpu.grad, gpu.grad = torch.ones(32), fake_cuda(32)
    before = cpu.detach().clone()
    with pytest.raises(quantrs.CudaNotAvailable, match="parameter 1 is on cuda"):
        opt.step()
    assert torch.equal(cpu, before)
    assert opt.state_dict()["state"] == {} and not opt.state


def test_qat_construction_with_a_cuda_parameter_changes_nothing(fake_cuda):
    cpu = torch.nn.Parameter(torch.randn(32))
    before = cpu.detach().clone()
    with pytest.raises(quantrs.CudaNotAvailable, match="parameter 1 is on cuda"):
        qt.QatAdamW([cpu, torch.nn.Parameter(fake_cuda(32))], target="int8")
    assert torch.equal(cpu, before)  # not overwritten with a quantized view

    opt = qt.QatAdamW([cpu], target="int8")
    view, state = cpu.detach().clone(), opt.state_dict()
    extra = torch.nn.Parameter(torch.randn(8))
    extra0 = extra.detach().clone()
    with pytest.raises(quantrs.CudaNotAvailable, match="parameter 2 is on cuda"):
        opt.add_param_group({"params": [extra, torch.nn.Parameter(fake_cuda(8))]})
    assert len(opt.param_groups) == 1 and torch.equal(extra, extra0)
    assert torch.equal(cpu, view)
    now = opt.state_dict()
    assert now["state"].keys() == state["state"].keys() == {0}
    assert all(torch.equal(now["state"][0][k], t) for k, t in state["state"][0].items())


@pytest.mark.parametrize("cls", [qt.Int4Linear, qt.FP8Linear])
def test_layers_refuse_cuda_weights_and_inputs(cls, fake_cuda):
    with pytest.raises(quantrs.CudaNotAvailable, match="weight is on cuda"):
        cls.from_linear(fake_cuda.linear(64, 16))
    torch.manual_seed(0)
    layer = cls.from_linear(torch.nn.Linear(64, 16))
    x = torch.randn(3, 64)
    want = layer(x).clone()
    buffers = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(quantrs.CudaNotAvailable, match="input is on cuda"):
        layer(fake_cuda(3, 64))
    assert all(torch.equal(layer.state_dict()[k], v) for k, v in buffers.items())
    assert torch.equal(layer(x), want)
