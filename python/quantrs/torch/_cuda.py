"""CUDA tensors in ``quantrs.torch``: what the optimizers and the inference modules need
to run on a GPU through ``quantrs.cuda`` (docs/gpu.md, docs/torch.md).

- Parameters and gradients reach the device engines through DLPack, zero-copy: quantrs
  asks torch for them on the legacy default stream, so torch orders its pending work on
  the current stream before quantrs reads, and every quantrs call returns when its
  result is complete (no synchronisation needed on either side).
- One device engine per parameter, on the parameter's device; its ``state_dict()``
  is the CPU format, so torch-format state dicts are the same on CPU and GPU (the
  quantized state is exported as CPU tensors, as the engine keeps the device copy).
- ``Int4Linear`` / ``FP8Linear`` on CUDA inputs: the module's packed buffers (on any
  device) are moved once per device and buffer version, and the kernels' output is
  handed to torch zero-copy.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _core
from .. import cuda as qcuda

_F32 = torch.float32


def is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def require(where: str, device: torch.device) -> int:
    """The CUDA ordinal of ``device``, or ``CudaNotAvailable`` with the reason."""
    reason = qcuda.unavailable_reason()
    if reason is not None:
        raise _core.CudaNotAvailable(f"{where} is on {device}: {reason}")
    return 0 if device.index is None else int(device.index)


def check_param(where: str, p: torch.Tensor) -> None:
    """A CUDA parameter the device engine can update in place."""
    require(where, p.device)
    if p.dtype != _F32:
        raise TypeError(f"{where}: expected dtype torch.float32, got {p.dtype}")
    if p.is_sparse or p.layout != torch.strided:
        raise TypeError(f"{where}: expected a dense (strided) tensor, got layout {p.layout}")
    if not p.is_contiguous():
        raise ValueError(f"{where}: expected a contiguous tensor (the update runs in place)")
    if p.numel() == 0:
        raise ValueError(f"{where}: expected at least one element, got shape {tuple(p.shape)}")


def check_grad(where: str, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of the CUDA parameter ``p``: on ``p``'s device, float32, ``p``'s
    shape, finite; contiguous (a copy only when it is not). Finiteness is checked here
    too (the engine checks it again) so that a bad gradient of one parameter stops the
    optimizer step before any parameter changes."""
    if g.is_sparse or g.layout != torch.strided:
        raise TypeError(f"{where}: sparse gradients are not supported (layout {g.layout})")
    if g.is_complex() or g.dtype != _F32:
        raise TypeError(f"{where}: expected a torch.float32 gradient, got {g.dtype}")
    if g.device != p.device:
        raise _core.InvalidArgument(
            f"{where}: the gradient is on {g.device} but the parameter is on {p.device}"
        )
    if g.shape != p.shape:
        raise ValueError(
            f"{where}: gradient shape {tuple(g.shape)} does not match the parameter's "
            f"{tuple(p.shape)}"
        )
    g = g.detach().contiguous()
    if not bool(torch.isfinite(g).all()):
        bad = int((~torch.isfinite(g)).flatten().nonzero()[0])
        raise _core.InvalidArgument(
            f"{where}: the gradient has a non-finite value {float(g.flatten()[bad])} at flat "
            f"index {bad}"
        )
    return g


def view(t: torch.Tensor) -> Any:
    """What the engines take: a NumPy view of a CPU tensor, the detached tensor itself
    (a DLPack producer, read and written in place) for a CUDA one."""
    if is_cuda(t):
        return t.detach()
    return t.detach().numpy()


def engine_class(cpu_cls: Any) -> Any:
    """The device twin of ``_core.AdamW4bit`` / ``_core.Adam4bit``."""
    return qcuda.AdamW4bit if cpu_cls is _core.AdamW4bit else qcuda.Adam4bit


def new_engine(cpu_cls: Any, optimizer_config: Any, quantization_config: Any, p: torch.Tensor):
    """An engine for parameter ``p``: the CPU class for CPU tensors, its device twin on
    ``p``'s device for CUDA tensors (same interface)."""
    if not is_cuda(p):
        return cpu_cls.with_quantization_config(optimizer_config, quantization_config)
    return engine_class(cpu_cls).with_quantization_config(
        optimizer_config, quantization_config, device=require("parameter", p.device)
    )


def _on_device(module: torch.nn.Module, device: torch.device, cpu_layer: Any) -> Any:
    """``cpu_layer.to(device)``, kept on the module until the CPU layer changes."""
    cache = module.__dict__.setdefault("_quantrs_cuda", {})
    idx = require(type(module).__name__, device)
    hit = cache.get(idx)
    if hit is None or hit[0] is not cpu_layer:
        hit = (cpu_layer, cpu_layer.to(f"cuda:{idx}"))
        cache[idx] = hit
    return hit[1]


def _host(t: torch.Tensor | None) -> Any:
    return None if t is None else t.detach().cpu().numpy()


def int4_layer(module: Any) -> Any:
    """The module's ``QuantizedWeight`` built from its buffers on any device."""

    def build():
        return _core.QuantizedWeight(
            _host(module.qweight),
            _host(module.scales),
            module.in_features,
            module.out_features,
            module.num_groups,
        )

    return module._cache.get([module.qweight, module.scales], build)


def fp8_layer(module: Any) -> Any:
    """The module's ``PerTensorFP8Linear`` built from its buffers on any device."""

    def build():
        a = module.activation_scale
        return _core.PerTensorFP8Linear(
            _host(module.weight),
            float(module.weight_scale_inv),
            activation_scale=None if a is None else float(a),
            bias=_host(module.bias),
        )

    bufs = [module.weight, module.weight_scale_inv, module.activation_scale, module.bias]
    return module._cache.get(bufs, build)


def check_input(owner: str, x: torch.Tensor, in_features: int) -> torch.Tensor:
    """A CUDA input as ``[rows, in_features]`` float32, contiguous, on its device."""
    require(owner, x.device)
    if not x.is_floating_point():
        raise TypeError(f"{owner}: expected a floating-point input, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(
            f"{owner}: expected an input whose last dimension is in_features={in_features}, "
            f"got shape {tuple(x.shape)}"
        )
    return x.detach().reshape(-1, in_features).to(_F32).contiguous()


def int4_forward(module: Any, x: torch.Tensor) -> torch.Tensor:
    """``Int4Linear.forward`` of a CUDA input (any leading shape)."""
    x2 = check_input("Int4Linear", x, module.in_features)
    layer = _on_device(module, x.device, int4_layer(module))
    y = torch.from_dlpack(layer.matmul(x2))
    if module.bias is not None:
        y += module.bias.to(y.device, _F32)
    return y.reshape(*x.shape[:-1], module.out_features)


def fp8_forward(module: Any, x: torch.Tensor) -> torch.Tensor:
    """``FP8Linear.forward`` of a CUDA input (any leading shape)."""
    x2 = check_input("FP8Linear", x, module.in_features)
    layer = _on_device(module, x.device, fp8_layer(module))
    y = torch.from_dlpack(layer.forward(x2))
    return y.reshape(*x.shape[:-1], module.out_features)
