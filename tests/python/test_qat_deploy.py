"""QatAdamW(grid="deploy") and convert_qat: the QAT view on the serving layer's grid
(checked against a NumPy re-derivation of each format's documented rule), bit-identical
codes and scales after convert, and the served forward against the QAT forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import quantrs
import quantrs.torch as qt

torch.set_num_threads(1)

ml_dtypes = pytest.importorskip("ml_dtypes")


def _int4_ref(w: np.ndarray, gs: int) -> np.ndarray:
    """docs/int4.md: per group of ``gs`` inputs of each output, ``s = max(absmax / 7,
    1e-8)``, ``q = clamp(round_half_even(w / s), -8, 7)``, ``w ~ q * s`` (float32)."""
    out, inn = w.shape
    r = np.empty_like(w)
    for g0 in range(0, inn, gs):
        blk = w[:, g0 : g0 + gs]
        s = np.maximum(np.abs(blk).max(axis=1, keepdims=True) / np.float32(7), np.float32(1e-8))
        q = np.clip(np.round(blk / s), -8, 7)
        r[:, g0 : g0 + gs] = (q * s).astype(np.float32)
    return r


def _int8_ref(w: np.ndarray) -> np.ndarray:
    """src/format/int8.rs: ``s[o] = absmax(W[o]) / 127``, ``q = round_half_even(W / s)``."""
    s = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
    return (np.clip(np.round(w / s), -127, 127) * s).astype(np.float32)


def _fp8_ref(w: np.ndarray) -> np.ndarray:
    """src/format/fp8_e4m3.rs: ``s = absmax / 448``, codes the saturating E4M3 cast of
    ``w / s`` (ml_dtypes as the independent codec)."""
    s = np.abs(w).max() / np.float32(448)
    y = np.clip(w / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (y * s).astype(np.float32)


REFS = {
    ("int4", 32): lambda w: _int4_ref(w, 32),
    ("int4", 128): lambda w: _int4_ref(w, 128),
    ("int8", 32): _int8_ref,
    ("fp8_e4m3", 32): _fp8_ref,
}


@pytest.mark.parametrize("target,gs", list(REFS))
def test_the_view_is_the_serving_grid_at_start_and_after_steps(target, gs):
    gen = torch.Generator().manual_seed(3)
    p = nn.Parameter(torch.randn(24, 256, generator=gen))
    p.data[5, :32] *= 20.0  # one group far wider than the rest: per-tensor would crush it
    opt = qt.QatAdamW([p], target=target, lr=1e-2, grid="deploy", group_size=gs)
    for _ in range(3):
        ref = REFS[(target, gs)](opt.state[p]["master"].numpy())
        np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-6, atol=0)
        p.grad = torch.randn(24, 256, generator=gen)
        opt.step()
    # The master follows torch's AdamW (straight-through: the gradient applied unchanged).
    assert not torch.equal(p.detach(), opt.state[p]["master"])


def test_deploy_int4_keeps_narrow_groups_that_the_tensor_grid_loses():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 0.01
    w[0, 0] = 10.0
    pt, pd = nn.Parameter(w.clone()), nn.Parameter(w.clone())
    qt.QatAdamW([pt], target="int4")
    qt.QatAdamW([pd], target="int4", grid="deploy", group_size=32)
    err_t = (pt.detach() - w)[1:].abs().mean()
    err_d = (pd.detach() - w)[1:].abs().mean()
    assert err_t == w[1:].abs().mean()  # the tensor grid rounds every small weight to 0
    assert err_d < err_t / 5


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 96), nn.Linear(96, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _train(net: nn.Module, opt: torch.optim.Optimizer, steps: int = 4) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 64, generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()
    return x


SERVED = {"int4": qt.Int4Linear, "int8": qt.Int8Linear, "fp8_e4m3": qt.FP8Linear}


@pytest.mark.parametrize("target,gs", [("int4", 32), ("int4", 64), ("int8", 32), ("fp8_e4m3", 32)])
def test_convert_holds_the_qat_codes_and_scales(target, gs):
    torch.manual_seed(0)
    net = _Net()
    opt = qt.QatAdamW(
        [net.fc1.weight, net.fc2.weight], target=target, lr=1e-2, grid="deploy", group_size=gs
    )
    extra = torch.optim.AdamW([net.fc1.bias], lr=1e-2)
    x = _train(net, _Both(opt, extra))
    with torch.no_grad():
        qat_w = [net.fc1.weight.clone(), net.fc2.weight.clone()]
        y_qat = net(x)
    qt.convert_qat(net, opt)
    kind = SERVED[target]
    assert isinstance(net.fc1, kind) and isinstance(net.fc2, kind)
    if target == "int4":
        assert net.fc1.group_size == gs
    for m, w in zip((net.fc1, net.fc2), qat_w, strict=True):
        assert torch.equal(m.dequantize(), w)  # same codes, same scales: bit for bit
    assert net.fc2.bias is None
    y = net(x)
    # Served kernels accumulate in their own order: |y - y_qat| <= k * 2^-23 * sum|x||w|.
    np.testing.assert_allclose(y.numpy(), y_qat.numpy(), rtol=1e-5, atol=1e-5)


class _Both:
    def __init__(self, *opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    def zero_grad(self) -> None:
        for o in self.opts:
            o.zero_grad()

    def step(self) -> None:
        for o in self.opts:
            o.step()


def test_w8a8_activation_scale_is_calibrated_and_served():
    torch.manual_seed(2)
    net = qt.prepare_w8a8(_Net())
    opt = qt.QatAdamW([net.fc1.weight, net.fc2.weight], target="fp8_e4m3", lr=1e-2, grid="deploy")
    x = _train(net, opt, steps=3)
    s1 = float(net.fc1.input_fake_quant.scale)
    assert s1 == pytest.approx(float(x.abs().max()) / 448, rel=1e-6)
    net.eval()
    with torch.no_grad():
        h = net.fc1.input_fake_quant(x)
        # The input fake quantization against ml_dtypes' E4M3 cast.
        ref = (x.numpy() / np.float32(s1)).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        np.testing.assert_array_equal(h.numpy(), ref * np.float32(s1))
        y_qat = net(x)
    s2 = float(net.fc2.input_fake_quant.scale)
    qt.convert_qat(net, opt)
    assert float(net.fc1.activation_scale) == s1 and float(net.fc2.activation_scale) == s2
    np.testing.assert_allclose(net(x).numpy(), y_qat.numpy(), rtol=1e-5, atol=1e-5)


def test_w8a8_gradient_is_straight_through():
    fq = qt.FP8ActivationFakeQuant()
    x = torch.randn(4, 8, requires_grad=True)
    y = fq(x)
    y.backward(torch.arange(32.0).reshape(4, 8))
    assert torch.equal(x.grad, torch.arange(32.0).reshape(4, 8))
    assert not torch.equal(y.detach(), x.detach())


def test_tensor_grid_linears_are_left_alone():
    net = _Net()
    opt = qt.QatAdamW([net.fc1.weight], target="int4")
    qt.convert_qat(net, opt)
    assert type(net.fc1) is nn.Linear


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(grid="row"), "grid"),
        (dict(grid="deploy", group_size=3), "group_size"),
        (dict(grid="deploy", group_size=True), "group_size"),
        (dict(grid="deploy", target="fp8_e5m2"), "target"),
        (dict(grid="deploy", scheme="asymmetric"), "scheme"),
        (dict(grid="deploy", rounding="stochastic"), "rounding"),
    ],
)
def test_bad_settings_raise_and_leave_the_parameter(kwargs, match):
    p = nn.Parameter(torch.randn(4, 32))
    w = p.detach().clone()
    kwargs = {"target": "int4", **kwargs}
    with pytest.raises(quantrs.InvalidArgument, match=match):
        qt.QatAdamW([p], **kwargs)
    assert torch.equal(p.detach(), w)


def test_deploy_grid_wants_2d_weights():
    b = nn.Parameter(torch.randn(32))
    with pytest.raises(quantrs.InvalidArgument, match="2-D"):
        qt.QatAdamW([b], target="int4", grid="deploy")


def test_convert_wants_a_qat_optimizer():
    net = _Net()
    with pytest.raises(TypeError, match="QatAdamW"):
        qt.convert_qat(net, torch.optim.AdamW(net.parameters()))


def test_uncalibrated_activation_scale_raises():
    fq = qt.FP8ActivationFakeQuant().eval()
    with pytest.raises(quantrs.InvalidState, match="calibrated"):
        fq(torch.randn(2, 3))


def test_state_dict_round_trip_keeps_the_deploy_grid():
    gen = torch.Generator().manual_seed(4)
    p = nn.Parameter(torch.randn(8, 64, generator=gen))
    opt = qt.QatAdamW([p], target="int4", lr=1e-2, grid="deploy")
    p.grad = torch.randn(8, 64, generator=gen)
    opt.step()
    q = nn.Parameter(p.detach().clone())
    opt2 = qt.QatAdamW([q], target="int4", lr=1e-2, grid="deploy")
    opt2.load_state_dict(opt.state_dict())
    g = torch.randn(8, 64, generator=gen)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(p.detach(), q.detach())


def test_a_state_dict_without_grid_keys_restores_the_tensor_grid():
    gen = torch.Generator().manual_seed(5)
    p = nn.Parameter(torch.randn(4, 32, generator=gen))
    opt = qt.QatAdamW([p], target="int4", lr=1e-2)
    p.grad = torch.randn(4, 32, generator=gen)
    opt.step()
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        del g["grid"], g["group_size"]
    q = nn.Parameter(p.detach().clone())
    opt2 = qt.QatAdamW([q], target="int4", lr=1e-2)
    opt2.load_state_dict(sd)
    g = torch.randn(4, 32, generator=gen)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(p.detach(), q.detach())
    assert opt2.param_groups[0]["grid"] == "tensor"


def test_w8a8_on_an_int4_linear_is_refused_before_any_swap():
    net = qt.prepare_w8a8(_Net())
    opt = qt.QatAdamW([net.fc1.weight, net.fc2.weight], target="int4", grid="deploy")
    _train(net, opt, steps=1)
    with pytest.raises(quantrs.InvalidArgument, match="prepare_w8a8"):
        qt.convert_qat(net, opt)
    assert type(net.fc1) is nn.Linear and type(net.fc2) is nn.Linear


def test_a_linear_shared_by_two_parents_is_served_by_one_module():
    lin = nn.Linear(32, 8)
    net = nn.Sequential(nn.Sequential(lin), lin)
    opt = qt.QatAdamW([lin.weight], target="int4", grid="deploy")
    qt.convert_qat(net, opt)
    assert isinstance(net[1], qt.Int4Linear) and net[0][0] is net[1]


@pytest.mark.parametrize("target,gs", list(REFS))
def test_numpy_fake_quant_deploy_against_the_reference(target, gs):
    w = np.random.default_rng(7).standard_normal((12, 256)).astype(np.float32)
    w[3, 64:96] *= 30.0
    out = quantrs.qat.fake_quant_deploy(w, target, gs)
    np.testing.assert_allclose(out, REFS[(target, gs)](w), rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "w,target,gs,match",
    [
        (np.ones((2, 32), np.float32), "fp8_e5m2", 32, "target"),
        (np.ones((2, 32), np.float32), "int4", 7, "group_size"),
        (np.ones(32, np.float32), "int4", 32, "2-D"),
        (np.ones((2, 32)), "int8", 32, "float32"),
    ],
)
def test_numpy_fake_quant_deploy_bad_inputs(w, target, gs, match):
    with pytest.raises(quantrs.InvalidArgument, match=match):
        quantrs.qat.fake_quant_deploy(w, target, gs)
