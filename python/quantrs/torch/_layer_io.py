"""What every quantized torch layer does with its input and the ``nn.Linear`` it replaces:
the dtype and shape checks, the route to the custom operator, and when autograd needs a
graph node (shared by ``_modules`` and ``_int8``)."""

from __future__ import annotations

import functools
import operator

import torch
from torch import nn

from .. import _core
from . import _cuda

_F32 = torch.float32

# The activation dtypes the CPU path takes as they are (the output has the same dtype).
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def check_features(owner: str, x: torch.Tensor, in_features: int) -> None:
    """A floating-point tensor whose last dimension is ``in_features`` (TypeError /
    InvalidArgument naming the layer otherwise)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner}: expected a torch.Tensor input, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{owner}: expected a floating-point input, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise _core.InvalidArgument(
            f"{owner}: expected an input whose last dimension is in_features={in_features}, "
            f"got shape {tuple(x.shape)}"
        )


def _check_input(owner: str, x: torch.Tensor, in_features: int) -> torch.Tensor:
    check_features(owner, x, in_features)
    if x.device.type == "cuda":
        _cuda.require(f"{owner}: the input", x.device)
    elif x.device.type != "cpu":
        raise _core.InvalidArgument(f"{owner}: expected a CPU or CUDA input, got device {x.device}")
    return x.detach().reshape(-1, in_features).to(_F32).contiguous()


def _route(owner: str, x: torch.Tensor, in_features: int) -> torch.Tensor | None:
    """None for a CPU input the custom op takes as it is (a float dtype of ``_FLOATS``,
    ``in_features`` wide); otherwise the checked float32 rows (a CUDA input's device path)
    or the exception naming what is wrong."""
    if isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype in _FLOATS:
        if x.dim() == 0 or x.shape[-1] != in_features:
            _check_input(owner, x, in_features)
        return None
    return _check_input(owner, x, in_features)


def _needs_graph(x: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the call goes through the custom op's dispatcher: when compiling or
    exporting (the op is what the graph holds), or when autograd has something to record;
    plain eager inference calls the kernel directly (one Python frame less)."""
    if torch.compiler.is_compiling():
        return True
    return torch.is_grad_enabled() and (
        x.requires_grad or (bias is not None and bias.requires_grad)
    )


def eager_f32(x: object) -> bool:
    """Whether ``x`` takes the serving fast path: a plain float32 CPU tensor outside
    compilation with nothing for autograd to record on its side."""
    return (
        type(x) is _Tensor
        and x.dtype is _F32
        and x.is_cpu
        and not x.requires_grad
        and not _compiling()
    )


_Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling
_data_ptr = torch.Tensor.data_ptr


def kernel_args(module: nn.Module) -> tuple | None:
    """The cached serving state of ``module``: ``(getter, buffers, views, live, ptrs,
    call)`` with ``views`` the NumPy views a ``_core.*_linear`` call reads in place and
    ``call(x, *views)`` that call. ``module._serving()`` says what to build: ``(names,
    make, kernel, kw)``, the buffer names, ``make(*buffers) -> views``, the kernel and its
    keyword arguments. Made again only when one of the buffers is replaced or its storage
    moves (``load_state_dict`` copies into the buffers: the views see it). None where the
    fast path does not apply: a buffer off the CPU, or one that requires grad (autograd
    then goes through the custom op)."""
    hit = module.__dict__.get("_views")
    if hit is not None and _fresh(hit, module._buffers):
        return hit
    names, make, kernel, kw = module._serving()
    buf = module._buffers
    ts = tuple([buf[n] for n in names])
    if any(t is not None and (not t.is_cpu or t.requires_grad) for t in ts):
        return None
    live = tuple([t for t in ts if t is not None])
    # Holding the tensors keeps their ids from being reused; the storage pointers catch a
    # tensor whose storage is swapped under it (``.data =``, ``set_``), which would leave
    # the views pointing at freed memory.
    hit = (
        operator.itemgetter(*names),
        ts,
        make(*ts),
        live,
        tuple(map(_data_ptr, live)),
        functools.partial(kernel, **kw) if kw else kernel,
    )
    module.__dict__["_views"] = hit
    return hit


def _fresh(hit: tuple, buffers: dict) -> bool:
    """Whether the cached views still read the module's buffers: the same tensor objects
    (``map`` / ``all`` run in C: the check costs well under a microsecond) over the same
    storage. Every layer has at least two buffer names, so ``getter`` gives a tuple."""
    return all(map(operator.is_, hit[0](buffers), hit[1])) and (
        tuple(map(_data_ptr, hit[3])) == hit[4]
    )


def serve(module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The serving fast path: the layer's kernel over its buffers' cached views
    (:func:`kernel_args`) in one Rust call, as a tensor, for an :func:`eager_f32` input;
    None where it does not apply or the input is wrong (the caller's checked route then
    raises, naming the layer). The checks are inlined and nothing is built per call: this
    runs once per layer per token."""
    if (
        type(x) is not _Tensor
        or x.dtype is not _F32
        or not x.is_cpu
        or x.requires_grad
        or _compiling()
    ):
        return None
    hit = module.__dict__.get("_views")
    if hit is None or not _fresh(hit, module._buffers):
        hit = kernel_args(module)
        if hit is None:
            return None
    try:
        return _from_numpy(hit[5](x.numpy(), *hit[2]))
    except _core.QuantError:
        return None


def forget_views(module: nn.Module) -> None:
    """Drops the cached serving state (a setting the kernel call reads has changed)."""
    module.__dict__.pop("_views", None)


_from_numpy = torch.from_numpy


def drop_views(state: dict) -> dict:
    """A module's ``__dict__`` for pickling, without the cached views (rebuilt on use)."""
    state = dict(state)
    state.pop("_views", None)
    return state


def _weight_of(owner: str, linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{owner}.from_linear: expected an nn.Linear, got {type(linear).__name__}")
    w = linear.weight
    if w.device.type == "cuda":
        _cuda.require(f"{owner}.from_linear: the weight", w.device)
    elif w.device.type != "cpu":
        raise TypeError(f"{owner}.from_linear: expected a CPU or CUDA weight, got {w.device}")
    if not w.is_floating_point():
        raise TypeError(f"{owner}.from_linear: expected a floating-point weight, got {w.dtype}")
    b = linear.bias
    # Quantized on the CPU; from_linear moves the module to the weight's device after.
    w = w.detach().cpu().to(_F32)
    return w, (None if b is None else b.detach().cpu().to(_F32).contiguous())


def int4_bf16(x: torch.Tensor, args: tuple) -> torch.Tensor | None:
    """``x @ W + bias`` for a bfloat16 CPU ``x``, in bfloat16, through
    ``_core.int4_linear_bf16``, which reads ``x``'s bits in place (no float32 copy of
    the input; the bias, float32, is added before the one rounding). ``args`` are the
    weight arguments of ``_core.int4_linear``. None for any other input."""
    if x.dtype is not torch.bfloat16 or not x.is_cpu:
        return None
    n = args[4]
    bits = x.detach().reshape(-1, args[3]).contiguous().view(torch.uint16).numpy()
    y = _core.int4_linear_bf16(bits, *args)
    return torch.from_numpy(y).view(torch.bfloat16).reshape(*x.shape[:-1], n)
