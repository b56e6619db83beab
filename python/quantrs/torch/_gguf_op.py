"""``quantrs::gguf_linear``: the forward of :class:`quantrs.torch.GgufLinear` over its
``qweight`` buffer (GGUF blocks of one ggml type, ``[out, bytes per row]`` uint8) as a
PyTorch custom operator with a fake implementation, so ``torch.compile`` / ``torch.export``
hold one node per layer, and a backward giving the input ``grad_output @ W`` (the frozen
weight decoded a band of rows at a time; QLoRA trains adapters on top). As for the other
quantized linears (``_ops``), float32 / bfloat16 / float16 activations come back in their
own dtype, the kernel running in float32 and the result rounded once."""

from __future__ import annotations

import itertools

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


# ``quantrs::packed_linear``: the weights without a GGUF block form (``int4_asym`` of a
# group other than 32, ``IntZpWeight``) are Rust objects, which a custom operator cannot
# take as an argument; the op takes an int key into this table instead. ``GgufLinear``
# registers its weight on construction (and again on unpickling or deepcopy, which give
# a fresh key) and a ``weakref.finalize`` on the module drops the entry with it.
_PACKED: dict[int, object] = {}
_KEYS = itertools.count()


def register_packed(packed) -> int:
    """A new key for ``packed`` in the table the op reads."""
    key = next(_KEYS)
    _PACKED[key] = packed
    return key


def release_packed(key: int) -> None:
    _PACKED.pop(key, None)


def packed_linear_impl(x, bias, out_index, key: int, out_features: int) -> torch.Tensor:
    """``x @ W.T`` over the table's weight ``key``, the output features reordered by
    ``out_index`` (when given) before the bias is added (in float32, as the block path)."""
    packed = _PACKED[key]
    y = packed.matmul(_as_f32_rows(x, packed.shape[1]))
    if out_index is not None:
        y = y[:, out_index.numpy()]
    return _finish(y, x, bias, out_features)


@torch.library.custom_op("quantrs::packed_linear", mutates_args=(), device_types="cpu")
def packed_linear(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    out_index: torch.Tensor | None,
    key: int,
    out_features: int,
) -> torch.Tensor:
    return packed_linear_impl(x, bias, out_index, key, out_features)


@torch.library.custom_op("quantrs::packed_linear_grad_input", mutates_args=(), device_types="cpu")
def packed_linear_grad_input(
    grad: torch.Tensor, out_index: torch.Tensor | None, key: int, in_features: int
) -> torch.Tensor:
    packed = _PACKED[key]
    rows = torch.from_numpy(_as_f32_rows(grad, packed.shape[0]))
    if out_index is not None:  # y = (x W.T)[:, p]: the gradient goes back to rows p
        rows = torch.zeros_like(rows).index_copy_(1, out_index, rows)
    return _finish(packed_grad_input(packed, rows).numpy(), grad, None, in_features)


@packed_linear.register_fake
def _(x, bias, out_index, key, out_features):
    return _out_like(x, out_features)


@packed_linear_grad_input.register_fake
def _(grad, out_index, key, in_features):
    return _out_like(grad, in_features)


def _setup_packed(ctx, inputs, output) -> None:
    x, bias, out_index, key, _ = inputs
    _keep(ctx, bias, *(() if out_index is None else (out_index,)))
    ctx.dims = (key, x.shape[-1])


def _backward_packed(ctx, grad):
    if not ctx.needs_input_grad[0]:
        return None, _bias_grad(ctx, grad), None, None, None
    order = ctx.saved_tensors[0] if ctx.saved_tensors else None
    dx = packed_linear_grad_input(grad.contiguous(), order, *ctx.dims)
    return dx, _bias_grad(ctx, grad), None, None, None


torch.library.register_autograd(
    "quantrs::packed_linear", _backward_packed, setup_context=_setup_packed
)
