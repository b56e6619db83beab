"""Inference and fine-tuning modules: ``Int4Linear``, ``FP8Linear`` and ``quantize_``.

The packed weights are buffers (``module.state_dict()``, ``load_state_dict`` and
``torch.save`` see them); the Rust object that runs the kernel is built from the buffers on
the first forward and rebuilt whenever a buffer changes (``load_state_dict``, an in-place
write): it keeps its own copy of the packed bytes (docs/torch.md, "Memory"). On the CPU
``forward`` is the custom operator of ``_ops`` (``torch.compile`` / ``torch.export`` see one
node per layer), takes float32, bfloat16, float16 or float64 activations of any leading batch
shape and returns the input's dtype; the input gets its gradient ``grad_output @ W``, the
packed weight is frozen (docs/torch.md, "Fine-tuning on quantized weights").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

import numpy as np
import torch
from torch import nn

from .. import _core
from ..formats._ggml_types import QUANTIZE_TYPES, type_for
from . import _cuda, _ops, _quantize_plan
from ._gguf import GgufLinear
from ._int8 import Int8Linear
from ._layer_io import _needs_graph, _route, _weight_of, drop_views, forget_views, serve

_F32 = torch.float32
_INT4_BUFFERS = ("qweight", "scales", "bias")
_FP8_BUFFERS = ("weight", "weight_scale_inv", "activation_scale", "bias")


class Int4Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` packed to INT4, one float32 scale per ``group_size``
    inputs of each output (``quantrs.QuantizedWeight``; docs/int4.md).

    Buffers: ``qweight`` (uint8, two weights a byte), ``scales`` (float32), ``bias``;
    the kernel reads them in place. ``activations="int8"`` quantizes each input group to
    int8 and runs integer dot products (docs/int4.md, "Int8 activations")."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group_size: int = 32,
        *,
        activations: str = "float32",
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.activations = _activations(activations)
        shape = _core.QuantizedWeight.quantize(
            np.zeros((in_features, out_features), np.float32), group_size=group_size
        )
        self.register_buffer("qweight", torch.from_numpy(np.array(shape.data)))
        self.register_buffer("scales", torch.from_numpy(np.array(shape.scales)))
        self.num_groups = shape.num_groups
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        group_size: int = 32,
        *,
        method: str = "search",
        importance: np.ndarray | None = None,
        activations: str = "float32",
    ) -> Int4Linear:
        """``method`` / ``importance``: see ``QuantizedWeight.quantize``; ``activations``
        as in the constructor."""
        act = _activations(activations)
        w, b = _weight_of("Int4Linear", linear)
        qw = _core.QuantizedWeight.quantize(
            w.t().contiguous().numpy(), group_size=group_size, method=method, importance=importance
        )
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.in_features, m.out_features = linear.in_features, linear.out_features
        m.group_size, m.num_groups, m.activations = group_size, qw.num_groups, act
        m.register_buffer("qweight", torch.from_numpy(np.array(qw.data)))
        m.register_buffer("scales", torch.from_numpy(np.array(qw.scales)))
        m.register_buffer("bias", b)
        return m.to(linear.weight.device)

    def quantized_weight(self) -> _core.QuantizedWeight:
        """The ``quantrs.QuantizedWeight`` for the current buffers ([in, out] layout)."""
        return _ops.int4_weight(self.qweight, self.scales, self.in_features, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight as the kernel sees it, float32 ``[out_features, in_features]``."""
        return torch.from_numpy(self.quantized_weight().dequantize()).t().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Eager float32 CPU inference, the serving case: one Rust call over NumPy views of
        # the buffers, made once; everything else takes the route below.
        y = serve(self, x)
        if y is not None:
            return y
        x2 = _route("Int4Linear", x, self.in_features)
        if x2 is not None and x2.device.type == "cuda":
            return _cuda.int4_forward(self, x2, tuple(x.shape[:-1]))
        args = (x, self.qweight, self.scales, self.bias, self.in_features, self.out_features)
        if _needs_graph(x, self.bias):
            return _ops.int4_linear(*args, self.activations)
        return _ops.int4_linear_impl(*args, self.activations)

    def _args_of(self, qweight, scales, bias) -> tuple:
        return _ops.int4_args(qweight, scales, bias, self.in_features, self.out_features)

    def _serving(self) -> tuple:
        kw = {"activations": self.activations}
        return _INT4_BUFFERS, self._args_of, _core.int4_linear, kw

    @property
    def activations(self) -> str:
        return self._act

    @activations.setter
    def activations(self, value: str) -> None:
        # The serving fast path binds the setting into its cached kernel call.
        self.__dict__["_act"] = _activations(value)
        forget_views(self)

    def __getstate__(self) -> dict:
        return drop_views(self.__dict__)

    def extra_repr(self) -> str:
        act = "" if self.activations == "float32" else f", activations={self.activations!r}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, group_size={self.group_size}{act}"
        )


def _activations(value: str) -> str:
    if value not in ("float32", "int8"):
        raise _core.InvalidArgument(
            f"Int4Linear: activations: expected 'float32' or 'int8', got {value!r}"
        )
    return value


class FP8Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` stored as FP8 E4M3 codes and one float32 scale
    (``quantrs.PerTensorFP8Linear``; docs/fp8.md). With an ``activation_scale`` the
    input is quantized onto the E4M3 grid too (W8A8); without, it stays float32.

    Buffers: ``weight`` (uint8 E4M3 codes ``[out, in]``), ``weight_scale_inv`` (float32
    scalar), ``activation_scale`` (float32 scalar or None), ``bias``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation_scale: float | None = None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.uint8))
        self.register_buffer("weight_scale_inv", torch.tensor(1.0))
        a = None if activation_scale is None else torch.tensor(float(activation_scale))
        self.register_buffer("activation_scale", a)
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        activation_scale: float | None = None,
    ) -> FP8Linear:
        w, b = _weight_of("FP8Linear", linear)
        layer = _core.PerTensorFP8Linear.from_float(
            w.contiguous().numpy(),
            None if b is None else b.numpy(),
            activation_scale=activation_scale,
        )
        m = cls(linear.in_features, linear.out_features, b is not None, activation_scale)
        m.weight.copy_(torch.from_numpy(np.array(layer.weight)))
        m.weight_scale_inv.fill_(layer.weight_scale_inv)
        if b is not None:
            m.bias.copy_(b)
        return m.to(linear.weight.device)

    def layer(self) -> _core.PerTensorFP8Linear:
        """The ``quantrs.PerTensorFP8Linear`` for the current buffers (its bias is the
        module's: added outside the kernel)."""
        return _ops.fp8_layer(self.weight, self.weight_scale_inv, self.activation_scale)

    def dequantize(self) -> torch.Tensor:
        """The weight as the kernel sees it, float32 ``[out_features, in_features]``."""
        return torch.from_numpy(np.asarray(self.layer().dequantize_w(), np.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = serve(self, x)
        if y is not None:
            return y
        x2 = _route("FP8Linear", x, self.in_features)
        if x2 is not None and x2.device.type == "cuda":
            return _cuda.fp8_forward(self, x2, tuple(x.shape[:-1]))
        args = (x, self.weight, self.weight_scale_inv, self.activation_scale, self.bias)
        if _needs_graph(x, self.bias):
            return _ops.fp8_linear(*args)
        return _ops.fp8_linear_impl(*args)

    def _serving(self) -> tuple:
        return _FP8_BUFFERS, _ops.fp8_args, _core.fp8_linear, None

    def __getstate__(self) -> dict:
        return drop_views(self.__dict__)

    def extra_repr(self) -> str:
        a = self.activation_scale
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, "
            f"activation_scale={None if a is None else float(a)}"
        )


def default_filter(module: nn.Module, fqn: str) -> bool:
    """``quantize_``'s default: exactly ``nn.Linear`` (not subclasses such as
    ``MultiheadAttention.out_proj``, whose weight is read directly), with a floating-point
    CPU or CUDA weight, and not named ``lm_head`` (often tied to the embedding)."""
    return fqn.rsplit(".", 1)[-1] != "lm_head" and head_filter(module, fqn)


def head_filter(module: nn.Module, fqn: str) -> bool:
    """``quantize_(..., include_head=True)``'s filter: :func:`default_filter` with the
    ``lm_head`` too (a tied embedding keeps its float weight; docs/torch.md)."""
    return (
        type(module) is nn.Linear
        and module.weight.is_floating_point()
        and module.weight.device.type in ("cpu", "cuda")
    )


def quantize_(
    model: nn.Module,
    method: str,
    group_size: int = 32,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    activation_scale: float | None = None,
    quantizer: str | None = None,
    calibration: Iterable[object] | None = None,
    include_head: bool = False,
    activations: str = "float32",
) -> nn.Module:
    """Replace ``nn.Linear`` modules of ``model`` in place by ``Int4Linear`` (``"int4"``,
    ``group_size`` inputs per scale), ``GgufLinear`` over an ``Int4AsymWeight``
    (``"int4_asym"``: asymmetric INT4, frozen weight) or an ``Int4KWeight`` (``"int4_k"``:
    k-quant-style INT4, groups of 32, frozen weight; ``group_size`` must stay 32), ``Int8Linear``
    (``"int8"``, one scale per output channel; CPU) or ``FP8Linear`` (``"fp8"``, E4M3, W8A8 when
    an ``activation_scale`` is given). ``filter_fn(module, fqn)`` picks the modules (default:
    :func:`default_filter`). Returns ``model``; a module shared by several parents is quantized
    once. ``quantizer`` picks the INT4 scales ("search", the default, "rtn" (the grid of
    earlier releases) or "full" for "int4"; "search" or "rtn" for "int4_asym" and "int4_k";
    docs/int4.md "Quantizers"; "gptq", with ``calibration``: docs/int4.md "GPTQ"); ``calibration``
    batches, run through ``model`` first, give "search" each input's importance (mean ``x^2``),
    "gptq" its Hessians and "fp8" one activation scale per layer (docs/torch.md "Calibration").
    ``include_head`` quantizes the ``lm_head`` too (when no ``filter_fn`` is given);
    ``activations="int8"`` gives ``"int4"`` layers int8 activations (docs/int4.md "Int8
    activations").

    A GGUF block type (``"q4_0"``, ``"q4_1"``, ``"q5_0"``, ``"q5_1"``, ``"q8_0"``,
    ``"q4_k"``, ``"q5_k"``, ``"q6_k"``) gives ``GgufLinear`` layers over llama.cpp's
    quantization of the weight (``GgufWeight.quantize``, the same bytes; ``group_size``
    must stay 32, ``quantizer`` must be None), weighted by the importance ``calibration``
    gives; inputs that the type's block does not divide take llama.cpp's fallback (``q4_k
    -> q5_0``, ``q5_k -> q5_1``, ``q6_k -> q8_0``), and a layer whose inputs are not a
    multiple of 32 stays ``nn.Linear`` (llama.cpp: F16; docs/formats.md "Quantizing from
    float")."""
    if method not in ("int4", "int4_asym", "int4_k", "int8", "fp8", *QUANTIZE_TYPES):
        raise _core.InvalidArgument(
            "quantize_: method: expected 'int4', 'int4_asym', 'int4_k', 'int8', 'fp8' or a "
            f"GGUF type ({', '.join(map(repr, QUANTIZE_TYPES))}), got {method!r}"
        )
    if method in QUANTIZE_TYPES and quantizer is not None:
        raise _core.InvalidArgument(
            f"quantize_: quantizer: {method!r} has llama.cpp's quantizer only (weighted by the "
            f"importance of calibration when given); pass None, got {quantizer!r}"
        )
    if (method == "int4_k" or method in QUANTIZE_TYPES) and group_size != 32:
        raise _core.InvalidArgument(
            f"quantize_: group_size: {method!r} has fixed groups (32 inputs, or ggml's "
            f"blocks); leave the default 32, got {group_size!r}"
        )
    if method != "fp8" and activation_scale is not None:
        raise _core.InvalidArgument("quantize_: activation_scale applies to 'fp8' only")
    if activations != "float32" and method != "int4":
        raise _core.InvalidArgument(
            f"quantize_: activations={activations!r} applies to 'int4' only"
        )
    _activations(activations)
    if include_head and filter_fn is not None:
        raise _core.InvalidArgument(
            "quantize_: include_head applies to the default filter; with a filter_fn, "
            "let it pick the lm_head"
        )
    if filter_fn is None:
        filter_fn = head_filter if include_head else default_filter
    pick = filter_fn
    if isinstance(model, nn.Linear) and pick(model, ""):
        raise _core.InvalidArgument(
            "quantize_: pass the model holding the nn.Linear, not the layer itself"
        )
    todo = []
    fqn_of: dict[int, str] = {}
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for name, child in parent._modules.items():  # named_children() skips repeats
            fqn = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, nn.Linear) and pick(child, fqn):
                todo.append((parent, name, child))
                fqn_of.setdefault(id(child), fqn)
    if activation_scale is not None and calibration is not None:
        raise _core.InvalidArgument("quantize_: pass activation_scale or calibration, not both")
    cal = _quantize_plan.plan(model, method, quantizer, group_size, calibration, fqn_of, todo)
    done: dict[int, nn.Module] = {}
    for parent, name, child in todo:
        if id(child) not in done:
            fqn = fqn_of[id(child)]
            importance, packed = cal.importance.get(fqn), cal.packed.get(fqn)
            if method == "int4" and packed is not None:
                empty = Int4Linear(
                    child.in_features,
                    child.out_features,
                    False,
                    group_size,
                    activations=activations,
                )
                done[id(child)] = _quantize_plan.load_int4(empty, packed, child)
            elif method == "int4":
                done[id(child)] = Int4Linear.from_linear(
                    child,
                    group_size,
                    method=quantizer or "search",
                    importance=importance,
                    activations=activations,
                )
            elif method in ("int4_asym", "int4_k") and packed is not None:
                done[id(child)] = GgufLinear(packed, child.bias)
            elif method == "int4_asym":
                done[id(child)] = _asym_linear(child, group_size, quantizer or "search", importance)
            elif method == "int4_k":
                done[id(child)] = _k_linear(child, quantizer or "search", importance)
            elif method in QUANTIZE_TYPES:
                done[id(child)] = _ggml_linear(child, method, importance)
            elif method == "int8":
                done[id(child)] = Int8Linear.from_linear(child)
            else:
                scale = cal.act_scales.get(fqn, activation_scale)
                done[id(child)] = FP8Linear.from_linear(child, activation_scale=scale)
        setattr(parent, name, done[id(child)])
    return model


def _asym_linear(
    child: nn.Linear, group_size: int, quantizer: str, importance: np.ndarray | None
) -> nn.Module:
    """``child`` as a :class:`GgufLinear` over its weight quantized to ``int4_asym``."""
    w = child.weight.detach().to("cpu", torch.float32).contiguous().numpy()
    packed = _core.Int4AsymWeight.quantize(
        w, group_size=group_size, method=quantizer, importance=importance
    )
    return GgufLinear(packed, child.bias)


def _k_linear(child: nn.Linear, quantizer: str, importance: np.ndarray | None) -> nn.Module:
    """``child`` as a :class:`GgufLinear` over its weight quantized to ``int4_k``."""
    w = child.weight.detach().to("cpu", torch.float32).contiguous().numpy()
    packed = _core.Int4KWeight.quantize(w, method=quantizer, importance=importance)
    return GgufLinear(packed, child.bias)


def _ggml_linear(child: nn.Linear, gtype: str, importance: np.ndarray | None) -> nn.Module:
    """``child`` as a :class:`GgufLinear` over its weight quantized by llama.cpp's quantizer
    (``GgufWeight.quantize``) to ``gtype``, or to llama.cpp's fallback type where the
    inputs are not a multiple of ``gtype``'s block; ``child`` itself (float) where no ggml
    block fits (:mod:`quantrs.formats._ggml_types`)."""
    used = type_for(gtype, child.in_features)
    if used is None:
        return child
    w = child.weight.detach().to("cpu", torch.float32).contiguous().numpy()
    return GgufLinear(_core.GgufWeight.quantize(w, used, importance=importance), child.bias)
