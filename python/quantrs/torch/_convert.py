"""``convert_qat``: swap the linears a ``QatAdamW(grid="deploy")`` trained for serving
modules holding the same codes and scales (docs/torch.md "QAT to deployment").

Each ``nn.Linear`` whose weight the optimizer holds on a deploy grid is rebuilt from the
optimizer's float32 master through the serving module's public constructor -- the call
``_qat_grid.fake_quantize`` made for the QAT forward -- so ``dequantize()`` of the served
module equals the QAT parameter bit for bit. The served forward runs the serving kernel;
it accumulates in another order than ``torch.nn.functional.linear`` (the bound is in
docs/torch.md).
"""

from __future__ import annotations

from torch import nn

from .. import _core
from ._int8 import Int8Linear
from ._modules import FP8Linear, Int4Linear
from ._qat import QatAdamW

_NAME = "quantrs.torch.convert_qat"


def _serving(linear: nn.Linear, target: str, group_size: int, master) -> nn.Module:
    src = nn.Linear(linear.in_features, linear.out_features, bias=False, device="meta")
    src.weight = nn.Parameter(master.detach(), requires_grad=False)
    src.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
    act = getattr(linear, "input_fake_quant", None)
    if act is not None and target != "fp8_e4m3":
        raise _core.InvalidArgument(
            f"{_NAME}: a linear trained on target {target!r} has an FP8 input fake-quantizer "
            "(prepare_w8a8); only the fp8_e4m3 serving layer quantizes its input"
        )
    if target == "int4":
        # The grid QAT trained on (_qat_grid.fake_quantize), not from_linear's default.
        return Int4Linear.from_linear(src, group_size=group_size, method="rtn")
    if target == "fp8_e4m3":
        scale = None if act is None else float(act.scale)
        if scale is not None and scale <= 0.0:
            raise _core.InvalidState(
                f"{_NAME}: the activation scale of a W8A8 linear is not calibrated"
            )
        return FP8Linear.from_linear(src, activation_scale=scale)
    if target == "int8":
        return Int8Linear.from_linear(src)
    raise _core.UnsupportedOperation(
        f"{_NAME}: quantrs.torch has no serving module for target {target!r}"
    )


def convert_qat(model: nn.Module, optimizer: QatAdamW) -> nn.Module:
    """Replaces, in place, every ``nn.Linear`` of ``model`` whose weight ``optimizer``
    trains with ``grid="deploy"`` by its serving module (``int4``: :class:`Int4Linear` of
    the group's ``group_size``; ``int8``: :class:`Int8Linear`; ``fp8_e4m3``:
    :class:`FP8Linear`, W8A8 with the static scale of a :func:`prepare_w8a8` input
    fake-quantizer); returns ``model``. Linears on
    the per-tensor grid and other modules are left as they are."""
    if not isinstance(optimizer, QatAdamW):
        raise TypeError(
            f"{_NAME}: optimizer: expected a quantrs.torch.QatAdamW, got {type(optimizer).__name__}"
        )
    built: dict[int, nn.Module] = {}
    swaps = []
    if isinstance(model, nn.Linear):
        raise _core.InvalidArgument(
            f"{_NAME}: model: expected the module holding the linears, got an nn.Linear"
        )
    # Every parent of a shared linear gets the one serving module (as quantize_ does).
    for _, parent in model.named_modules(remove_duplicate=False):
        for name, m in parent._modules.items():
            if type(m) is not nn.Linear or m.weight not in optimizer._slots:
                continue
            target, _, grid, group_size = optimizer._slots[m.weight].fixed
            if grid != "deploy":
                continue
            if id(m) not in built:
                master = optimizer._slots[m.weight].master
                built[id(m)] = _serving(m, target, group_size, master)
            swaps.append((parent, name, built[id(m)]))
    for parent, name, new in swaps:  # all built first: a failure leaves the model untouched
        setattr(parent, name, new)
    return model
