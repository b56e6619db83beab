"""The deploy grid of ``QatAdamW(grid="deploy")``: fake quantization of a 2-D weight
``[out_features, in_features]`` on exactly the grid its serving layer stores.

The view is the serving format's own quantize-then-dequantize,
``quantrs.qat.fake_quant_deploy`` (no second copy of any grid rule):

- ``int4``: ``quantrs.QuantizedWeight.quantize(W^T, group_size=..., method="rtn")`` then
  ``dequantize()`` -- one absmax / 7 scale per ``group_size`` inputs of each output, the
  codes and scales ``quantrs.torch.Int4Linear.from_linear`` stores;
- ``int8``: ``quantrs.Int8Linear.from_float(W).dequantize_w()`` -- one absmax / 127
  scale per output channel;
- ``fp8_e4m3``: ``quantrs.PerTensorFP8Linear.from_float(W).dequantize_w()`` -- one
  absmax / 448 scale per tensor, the codes ``quantrs.torch.FP8Linear.from_linear`` stores.

``convert_qat`` (``_convert.py``) hands the same float32 master to the same constructor,
so the served layer holds the very codes and scales the QAT forward used.
"""

from __future__ import annotations

import torch

from .. import _core
from ..qat import DEPLOY_TARGETS, fake_quant_deploy

GRIDS = ("tensor", "deploy")


def check_group(owner: str, gi: int, group: dict) -> None:
    """The group's ``grid`` and ``group_size``, and the settings a deploy grid needs."""
    where = f"{owner}: param_groups[{gi}]"
    # A state dict saved before groups had these keys restores the per-tensor grid.
    grid = group.setdefault("grid", "tensor")
    gs = group.setdefault("group_size", 32)
    if grid not in GRIDS:
        raise _core.InvalidArgument(f"{where}['grid']: expected one of {GRIDS}, got {grid!r}")
    if isinstance(gs, bool) or not isinstance(gs, int) or gs < 2 or gs % 2:
        raise _core.InvalidArgument(f"{where}['group_size']: expected an even int >= 2, got {gs!r}")
    if grid == "tensor":
        return
    if group["target"] not in DEPLOY_TARGETS:
        raise _core.InvalidArgument(
            f"{where}['target']: grid='deploy' expects one of {DEPLOY_TARGETS} (the targets "
            f"with a serving layer), got {group['target']!r}"
        )
    if group["scheme"] != "symmetric":
        raise _core.InvalidArgument(
            f"{where}['scheme']: grid='deploy' is symmetric (as the serving layers), "
            f"got {group['scheme']!r}"
        )
    if group["rounding"] != "nearest":
        raise _core.InvalidArgument(
            f"{where}['rounding']: grid='deploy' rounds to nearest (as the serving "
            f"quantizers), got {group['rounding']!r}"
        )


def check_param(owner: str, index: int, p: torch.Tensor, group: dict) -> None:
    """A parameter a deploy grid can cover: a 2-D CPU weight ``[out, in]``."""
    if group["grid"] == "tensor":
        return
    where = f"{owner}: parameter {index}"
    if p.dim() != 2:
        raise _core.InvalidArgument(
            f"{where}: grid='deploy' expects a 2-D weight [out_features, in_features], got "
            f"shape {tuple(p.shape)} (put biases and norms in a group with grid='tensor' or "
            "in another optimizer)"
        )
    if p.device.type != "cpu":
        raise _core.UnsupportedOperation(
            f"{where}: grid='deploy' runs on the CPU, got device {p.device}"
        )


def fake_quantize(master: torch.Tensor, target: str, group_size: int) -> torch.Tensor:
    """The serving layer's dequantized weight for the float32 ``master`` ``[out, in]``."""
    return torch.from_numpy(fake_quant_deploy(master.detach().numpy(), target, group_size))
