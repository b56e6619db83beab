"""CUDA tensors in ``quantrs.torch``: what the optimizers and the inference modules need
to run on a GPU through ``quantrs.cuda`` (docs/gpu.md, docs/torch.md).

- The adapter's own checks (``_checks.py``, ``_modules._check_input``) hold for CUDA
  tensors too; ``require`` adds that CUDA is usable.
- Parameters and gradients reach the device engines through DLPack, zero-copy: quantrs
  asks torch for them on the legacy default stream, so torch orders its pending work on
  the current stream before quantrs reads, and every quantrs call returns when its
  result is complete (no synchronisation needed on either side).
- One engine per parameter, moved to the parameter's device; its ``state_dict()``
  is the CPU format, so torch-format state dicts are the same on CPU and GPU (the
  quantized state is exported as CPU tensors, as the engine keeps the device copy).
- ``Int4Linear`` / ``FP8Linear`` on CUDA inputs: the module's CPU layer (built from its
  buffers, on any device) is moved once per device and buffer version, and the
  kernels' output is handed to torch zero-copy.
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


def view(t: torch.Tensor) -> Any:
    """What the engines take: a NumPy view of a CPU tensor, the detached tensor itself
    (a DLPack producer, read and written in place) for a CUDA one."""
    if is_cuda(t):
        return t.detach()
    return t.detach().numpy()


def new_engine(cpu_cls: Any, optimizer_config: Any, quantization_config: Any, p: torch.Tensor):
    """An engine for parameter ``p``, moved to ``p``'s device when that is a GPU."""
    engine = cpu_cls.with_quantization_config(optimizer_config, quantization_config)
    if is_cuda(p):
        engine.to(f"cuda:{require('parameter', p.device)}")
    return engine


def new_qat_engine(master: torch.Tensor, config: Any, seed: int) -> Any:
    """A ``QatOptimizer`` for ``master``, on ``master``'s device (built from a host copy,
    once, then moved)."""
    if not is_cuda(master):
        return _core.QatOptimizer(master.detach().numpy(), config, rng=seed)
    ordinal = require("parameter", master.device)
    engine = _core.QatOptimizer(master.detach().cpu().numpy(), config, rng=seed)
    return engine.to(f"cuda:{ordinal}")


def _on_device(module: torch.nn.Module, device: torch.device, cpu_layer: Any) -> Any:
    """``cpu_layer.to(device)``, kept on the module until the CPU layer changes."""
    cache = module.__dict__.setdefault("_quantrs_cuda", {})
    idx = require(type(module).__name__, device)
    hit = cache.get(idx)
    if hit is None or hit[0] is not cpu_layer:
        hit = (cpu_layer, cpu_layer.to(f"cuda:{idx}"))
        cache[idx] = hit
    return hit[1]


def int4_forward(module: Any, x2: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """``Int4Linear.forward`` of a checked CUDA input ``x2`` ``[rows, in_features]``
    (float32, contiguous); the output gets the leading shape ``lead``."""
    layer = _on_device(module, x2.device, module.quantized_weight())
    y = torch.from_dlpack(layer.matmul(x2))
    if module.bias is not None:
        y += module.bias.to(y.device, _F32)
    return y.reshape(*lead, module.out_features)


def fp8_forward(module: Any, x2: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    """``FP8Linear.forward`` of a checked CUDA input, as :func:`int4_forward`."""
    layer = _on_device(module, x2.device, module.layer())
    y = torch.from_dlpack(layer.forward(x2))
    return y.reshape(*lead, module.out_features)
