"""The quantized linears as PyTorch custom operators (``torch.library.custom_op``):
``quantrs::int4_linear`` and ``quantrs::fp8_linear``, with fake implementations (so
``torch.compile`` and ``torch.export`` trace through them) and a backward registered with
``torch.library.register_autograd`` giving the input gradient ``grad_output @ W`` through
the Rust transposed kernels (the packed weight is never dequantized in full). The weight is
frozen: it gets no gradient; a float bias that requires grad gets ``grad_output`` summed.

Activations in float32, bfloat16 or float16 come back in the same dtype: the kernels run in
float32 and the result (bias added in float32) is rounded once to the input's dtype.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from .. import _core

_F32 = torch.float32

# id(tensor) -> (key of the buffers' storage and versions, Rust object); an entry leaves
# with its tensor (weakref.finalize), so an id is never reused while its entry lives.
_LAYERS: dict[int, tuple[tuple, Any]] = {}


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter
        return -1


def cached(anchor: torch.Tensor, buffers: list[torch.Tensor | None], build: Callable[[], Any]):
    """The Rust object built from ``buffers`` (``anchor`` first among them), rebuilt when
    one of them is replaced or written in place (``load_state_dict``, ``copy_``)."""
    key = tuple(None if b is None else (b.data_ptr(), _version(b)) for b in buffers)
    hit = _LAYERS.get(id(anchor))
    if hit is not None and hit[0] == key:
        return hit[1]
    layer = build()
    if hit is None:
        weakref.finalize(anchor, _LAYERS.pop, id(anchor), None)
    _LAYERS[id(anchor)] = (key, layer)
    return layer


def int4_weight(qweight: torch.Tensor, scales: torch.Tensor, in_f: int, out_f: int):
    def build():
        return _core.QuantizedWeight(
            qweight.detach().cpu().numpy(),
            scales.detach().cpu().numpy(),
            in_f,
            out_f,
            scales.numel() // out_f,
        )

    return cached(qweight, [qweight, scales], build)


def fp8_layer(weight: torch.Tensor, scale: torch.Tensor, act: torch.Tensor | None):
    def build():
        return _core.PerTensorFP8Linear(
            weight.detach().cpu().numpy(),
            float(scale),
            activation_scale=None if act is None else float(act),
        )

    return cached(weight, [weight, scale, act], build)


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


def int4_linear_impl(x, qweight, scales, bias, in_f: int, out_f: int) -> torch.Tensor:
    w = int4_weight(qweight, scales, in_f, out_f)
    return _finish(w.matmul(_as_f32_rows(x, in_f)), x, bias, out_f)


def fp8_linear_impl(x, weight, scale, act, bias) -> torch.Tensor:
    out_f, in_f = weight.shape
    layer = fp8_layer(weight, scale, act)
    return _finish(layer.forward(_as_f32_rows(x, in_f)), x, bias, out_f)


@torch.library.custom_op("quantrs::int4_linear", mutates_args=(), device_types="cpu")
def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    in_features: int,
    out_features: int,
) -> torch.Tensor:
    return int4_linear_impl(x, qweight, scales, bias, in_features, out_features)


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
def _(x, qweight, scales, bias, in_features, out_features):
    return _out_like(x, out_features)


@int4_linear_grad_input.register_fake
def _(grad, qweight, scales, in_features, out_features):
    return _out_like(grad, in_features)


@fp8_linear.register_fake
def _(x, weight, weight_scale_inv, activation_scale, bias):
    return _out_like(x, weight.shape[0])


@fp8_linear_grad_input.register_fake
def _(grad, weight, weight_scale_inv):
    return _out_like(grad, weight.shape[1])


def _keep_bias(ctx, bias: torch.Tensor | None) -> None:
    """What ``_bias_grad`` needs of the bias: whether it wants a gradient, its dtype."""
    ctx.bias_grad = bias is not None and bias.requires_grad
    ctx.bias_dtype = None if bias is None else bias.dtype


def _input_grad(ctx, op, grad: torch.Tensor, *weights):
    """``op(grad, *weights)`` where the input wants a gradient, else ``None``."""
    if not ctx.needs_input_grad[0]:
        return None
    return op(grad.contiguous(), *weights)


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


def _setup_int4(ctx, inputs, output) -> None:
    x, qweight, scales, bias, in_f, out_f = inputs
    _frozen(ctx, scales)
    ctx.save_for_backward(qweight, scales)
    ctx.dims = (in_f, out_f)
    _keep_bias(ctx, bias)


def _backward_int4(ctx, grad):
    dx = _input_grad(ctx, int4_linear_grad_input, grad, *ctx.saved_tensors, *ctx.dims)
    return dx, None, None, _bias_grad(ctx, grad), None, None


def _setup_fp8(ctx, inputs, output) -> None:
    x, weight, scale, act, bias = inputs
    _frozen(ctx, scale, act)
    ctx.save_for_backward(weight, scale)
    _keep_bias(ctx, bias)


def _backward_fp8(ctx, grad):
    dx = _input_grad(ctx, fp8_linear_grad_input, grad, *ctx.saved_tensors)
    return dx, None, None, None, _bias_grad(ctx, grad)


torch.library.register_autograd("quantrs::int4_linear", _backward_int4, setup_context=_setup_int4)
torch.library.register_autograd("quantrs::fp8_linear", _backward_fp8, setup_context=_setup_fp8)
