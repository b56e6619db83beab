"""``quantrs::gguf_linear``: the forward of :class:`quantrs.torch.GgufLinear` over its
``qweight`` buffer (GGUF blocks of one ggml type, ``[out, bytes per row]`` uint8) as a
PyTorch custom operator with a fake implementation, so ``torch.compile`` / ``torch.export``
hold one node per layer, and a backward giving the input ``grad_output @ W`` (the frozen
weight decoded a band of rows at a time; QLoRA trains adapters on top). As for the other
quantized linears (``_ops``), float32 / bfloat16 / float16 activations come back in their
own dtype, the kernel running in float32 and the result rounded once."""

from __future__ import annotations

import torch

from .. import _core
from ._ops import _as_f32_rows, _bias_grad, _finish, _input_grad, _keep, _out_like, _view

# Floats per decoded tile of the input gradient (1 MiB): the packed weight is decoded a
# band of rows at a time, never whole.
_TILE_FLOATS = 1 << 18


def packed_grad_input(packed, grad: torch.Tensor) -> torch.Tensor:
    """``grad @ W`` for float32 ``grad [rows, out]`` and a packed ``W [out, in]`` (any
    object with ``shape`` and ``dequantize_rows``)."""
    out_f, in_f = packed.shape
    dx = torch.zeros(grad.shape[0], in_f, dtype=torch.float32)
    band = max(1, _TILE_FLOATS // in_f)
    for r0 in range(0, out_f, band):
        r1 = min(out_f, r0 + band)
        dx.addmm_(grad[:, r0:r1], torch.from_numpy(packed.dequantize_rows(r0, r1)))
    return dx


def gguf_weight(qweight: torch.Tensor, weight_type: str, in_features: int):
    """A ``quantrs.GgufWeight`` copied from the buffer (``GgufLinear.weight_packed`` and
    the backward's row decode; the forward reads the buffer in place)."""
    shape = (qweight.shape[0], in_features)
    return _core.GgufWeight.from_bytes(weight_type, shape, qweight.detach().cpu().numpy())


def gguf_args(qweight: torch.Tensor, bias, weight_type: str, in_features: int) -> tuple:
    """The weight arguments of ``_core.gguf_linear``: a NumPy view of the buffer (the
    kernel reads the tensor's memory; nothing is copied), the type, the width, the bias."""
    return (qweight.detach().numpy(), weight_type, in_features, _view(bias))


def gguf_linear_impl(x, qweight, bias, weight_type: str, in_features: int) -> torch.Tensor:
    rows = _as_f32_rows(x, in_features)
    y = _core.gguf_linear(rows, *gguf_args(qweight, bias, weight_type, in_features))
    return _finish(y, x, None, qweight.shape[0])


@torch.library.custom_op("quantrs::gguf_linear", mutates_args=(), device_types="cpu")
def gguf_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    bias: torch.Tensor | None,
    weight_type: str,
    in_features: int,
) -> torch.Tensor:
    return gguf_linear_impl(x, qweight, bias, weight_type, in_features)


@torch.library.custom_op("quantrs::gguf_linear_grad_input", mutates_args=(), device_types="cpu")
def gguf_linear_grad_input(
    grad: torch.Tensor, qweight: torch.Tensor, weight_type: str, in_features: int
) -> torch.Tensor:
    packed = gguf_weight(qweight, weight_type, in_features)
    dx = packed_grad_input(packed, torch.from_numpy(_as_f32_rows(grad, qweight.shape[0])))
    return _finish(dx.numpy(), grad, None, in_features)


@gguf_linear.register_fake
def _(x, qweight, bias, weight_type, in_features):
    return _out_like(x, qweight.shape[0])


@gguf_linear_grad_input.register_fake
def _(grad, qweight, weight_type, in_features):
    return _out_like(grad, in_features)


def _setup(ctx, inputs, output) -> None:
    x, qweight, bias, weight_type, in_features = inputs
    _keep(ctx, bias, qweight)
    ctx.dims = (weight_type, in_features)


def _backward(ctx, grad):
    dx = _input_grad(ctx, grad, gguf_linear_grad_input, *ctx.dims)
    return dx, None, _bias_grad(ctx, grad), None, None


torch.library.register_autograd("quantrs::gguf_linear", _backward, setup_context=_setup)
