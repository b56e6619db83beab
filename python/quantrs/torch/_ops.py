"""The quantized linears as PyTorch custom operators (``torch.library.custom_op``):
``quantrs::int4_linear``, ``quantrs::int8_linear`` and ``quantrs::fp8_linear``, with
fake implementations (so ``torch.compile`` and ``torch.export`` trace through them) and a
backward registered with ``torch.library.register_autograd`` giving the input gradient
``grad_output @ W`` through the Rust transposed kernels (the packed weight is never
dequantized in full). The weight is frozen: it gets no gradient; a float bias that
requires grad gets ``grad_output`` summed.

Activations in float32, bfloat16 or float16 come back in the same dtype: the kernels run in
float32 and the result (bias added in float32) is rounded once to the input's dtype.
"""

from __future__ import annotations

import torch

from .. import _core
from . import _layer_io

_F32 = torch.float32


def int4_weight(qweight: torch.Tensor, scales: torch.Tensor, in_f: int, out_f: int):
    """A ``quantrs.QuantizedWeight`` copied from the buffers (``quantized_weight()`` and
    the backward's transposed kernel; the forward reads the buffers in place)."""
    return _core.QuantizedWeight(
        qweight.detach().cpu().numpy(),
        scales.detach().cpu().numpy(),
        in_f,
        out_f,
        scales.numel() // out_f,
    )


def int4_args(qweight: torch.Tensor, scales: torch.Tensor, bias, in_f: int, out_f: int):
    """The weight arguments of ``_core.int4_linear``: NumPy views of the buffers (the
    kernel reads the tensors' memory; nothing is copied) and the sizes."""
    groups = scales.numel() // out_f
    return (qweight.detach().numpy(), _view(scales), _view(bias), in_f, out_f, groups)


def fp8_layer(weight: torch.Tensor, scale: torch.Tensor, act: torch.Tensor | None):
    """A ``quantrs.PerTensorFP8Linear`` copied from the buffers (``layer()``,
    ``dequantize()`` and the backward's transposed kernel)."""
    return _core.PerTensorFP8Linear(
        weight.detach().cpu().numpy(),
        float(scale),
        activation_scale=None if act is None else float(act),
    )


def int8_layer(weight: torch.Tensor, scales: torch.Tensor):
    """A ``quantrs.Int8Linear`` copied from the buffers (as ``fp8_layer``)."""
    return _core.Int8Linear(weight.detach().cpu().numpy(), scales.detach().cpu().numpy())


def _view(t: torch.Tensor | None, dtype: torch.dtype = _F32):
    return None if t is None else t.detach().to(dtype).numpy()


def fp8_args(weight, scale, act, bias) -> tuple:
    """The weight arguments of ``_core.fp8_linear``: NumPy views of the buffers."""
    return (weight.detach().numpy(), _view(scale), _view(act), _view(bias))


def int8_args(weight, scales, bias) -> tuple:
    """The weight arguments of ``_core.int8_linear``: NumPy views of the buffers."""
    return (weight.detach().numpy(), _view(scales), _view(bias))


def _as_f32_rows(x: torch.Tensor, n: int):
    x2 = x.detach().reshape(-1, n)
    if x2.dtype != _F32:
        x2 = x2.to(_F32)
    return x2.contiguous().numpy()


def _finish(y, x: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    y = torch.from_numpy(y)
    if bias is not None:
        y += bias.detach().to(_F32)
    y = y.reshape(*x.shape[:-1], n)
    return y if x.dtype == _F32 else y.to(x.dtype)


def int4_linear_impl(
    x, qweight, scales, bias, in_f: int, out_f: int, activations: str = "float32"
) -> torch.Tensor:
    args = int4_args(qweight, scales, bias, in_f, out_f)
    if activations == "float32" and (yb := _layer_io.int4_bf16(x, args)) is not None:
        return yb
    y = _core.int4_linear(_as_f32_rows(x, in_f), *args, activations=activations)
    return _finish(y, x, None, out_f)


def int8_linear_impl(x, weight, scales, bias) -> torch.Tensor:
    out_f, in_f = weight.shape
    y = _core.int8_linear(_as_f32_rows(x, in_f), *int8_args(weight, scales, bias))
    return _finish(y, x, None, out_f)


def fp8_linear_impl(x, weight, scale, act, bias) -> torch.Tensor:
    out_f, in_f = weight.shape
    y = _core.fp8_linear(_as_f32_rows(x, in_f), *fp8_args(weight, scale, act, bias))
    return _finish(y, x, None, out_f)


@torch.library.custom_op("quantrs::int4_linear", mutates_args=(), device_types="cpu")
def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    in_features: int,
    out_features: int,
    activations: str,
) -> torch.Tensor:
    return int4_linear_impl(x, qweight, scales, bias, in_features, out_features, activations)


@torch.library.custom_op("quantrs::int4_linear_grad_input", mutates_args=(), device_types="cpu")
def int4_linear_grad_input(
    grad: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    in_features: int,
    out_features: int,
) -> torch.Tensor:
    w = int4_weight(qweight, scales, in_features, out_features)
    dx = w.matmul_transposed(_as_f32_rows(grad, out_features))
    return _finish(dx, grad, None, in_features)


@torch.library.custom_op("quantrs::int8_linear", mutates_args=(), device_types="cpu")
def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return int8_linear_impl(x, weight, scales, bias)


@torch.library.custom_op("quantrs::int8_linear_grad_input", mutates_args=(), device_types="cpu")
def int8_linear_grad_input(
    grad: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    out_f, in_f = weight.shape
    dx = int8_layer(weight, scales).grad_input(_as_f32_rows(grad, out_f))
    return _finish(dx, grad, None, in_f)


@torch.library.custom_op("quantrs::fp8_linear", mutates_args=(), device_types="cpu")
def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale_inv: torch.Tensor,
    activation_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    return fp8_linear_impl(x, weight, weight_scale_inv, activation_scale, bias)


@torch.library.custom_op("quantrs::fp8_linear_grad_input", mutates_args=(), device_types="cpu")
def fp8_linear_grad_input(
    grad: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor
) -> torch.Tensor:
    out_f, in_f = weight.shape
    layer = fp8_layer(weight, weight_scale_inv, None)
    return _finish(layer.grad_input(_as_f32_rows(grad, out_f)), grad, None, in_f)


def _out_like(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


@int4_linear.register_fake
def _(x, qweight, scales, bias, in_features, out_features, activations):
    return _out_like(x, out_features)


@int4_linear_grad_input.register_fake
def _(grad, qweight, scales, in_features, out_features):
    return _out_like(grad, in_features)


@int8_linear.register_fake
def _(x, weight, scales, bias):
    return _out_like(x, weight.shape[0])


@int8_linear_grad_input.register_fake
def _(grad, weight, scales):
    return _out_like(grad, weight.shape[1])


@fp8_linear.register_fake
def _(x, weight, weight_scale_inv, activation_scale, bias):
    return _out_like(x, weight.shape[0])


@fp8_linear_grad_input.register_fake
def _(grad, weight, weight_scale_inv):
    return _out_like(grad, weight.shape[1])


def _bias_grad(ctx, grad: torch.Tensor):
    if not ctx.bias_grad:
        return None
    return grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype)


def _frozen(ctx, *weights: torch.Tensor | None) -> None:
    for w in weights:
        if w is not None and w.requires_grad:
            raise _core.UnsupportedOperation(
                "quantized linear: the packed weight and its scales are frozen and get no "
                "gradient (set requires_grad=False on them; train adapters such as peft LoRA)"
            )


def _keep(ctx, bias: torch.Tensor | None, *saved: torch.Tensor) -> None:
    ctx.save_for_backward(*saved)
    ctx.bias_grad = bias is not None and bias.requires_grad
    ctx.bias_dtype = None if bias is None else bias.dtype


def _input_grad(ctx, grad: torch.Tensor, op, *extra) -> torch.Tensor | None:
    """``op(grad, *saved, *extra)`` (a ``*_grad_input`` op) where the input needs it."""
    if not ctx.needs_input_grad[0]:
        return None
    return op(grad.contiguous(), *ctx.saved_tensors, *extra)


def _setup_int4(ctx, inputs, output) -> None:
    x, qweight, scales, bias, in_f, out_f, _ = inputs
    _frozen(ctx, scales)
    _keep(ctx, bias, qweight, scales)
    ctx.dims = (in_f, out_f)


def _backward_int4(ctx, grad):
    dx = _input_grad(ctx, grad, int4_linear_grad_input, *ctx.dims)
    return dx, None, None, _bias_grad(ctx, grad), None, None, None


def _setup_int8(ctx, inputs, output) -> None:
    x, weight, scales, bias = inputs
    _frozen(ctx, scales)
    _keep(ctx, bias, weight, scales)


def _backward_int8(ctx, grad):
    return _input_grad(ctx, grad, int8_linear_grad_input), None, None, _bias_grad(ctx, grad)


def _setup_fp8(ctx, inputs, output) -> None:
    x, weight, scale, act, bias = inputs
    _frozen(ctx, scale, act)
    _keep(ctx, bias, weight, scale)


def _backward_fp8(ctx, grad):
    dx = _input_grad(ctx, grad, fp8_linear_grad_input)
    return dx, None, None, None, _bias_grad(ctx, grad)


torch.library.register_autograd("quantrs::int4_linear", _backward_int4, setup_context=_setup_int4)
torch.library.register_autograd("quantrs::int8_linear", _backward_int8, setup_context=_setup_int8)
torch.library.register_autograd("quantrs::fp8_linear", _backward_fp8, setup_context=_setup_fp8)
