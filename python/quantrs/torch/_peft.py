"""peft LoRA on the quantized layers (QLoRA): :func:`peft_config` registers ``Int4Linear``,
``Int8Linear``, ``FP8Linear`` and ``GgufLinear`` (GGUF blocks, ``int4_asym``) with a
``LoraConfig`` as base layers peft may wrap, the way peft wraps bitsandbytes ``Linear4bit``
(docs/torch.md, "Fine-tuning on quantized weights").

peft's LoRA layer runs ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``; the base
layer's backward gives ``x`` its gradient through the transposed kernels, so the adapters
train while the packed weight stays frozen. Merging would re-quantize the weight and lose
the adapter's update below the quantization step: ``merge`` refuses with a message saying
what to do instead (``unload()`` to drop the adapters, or merge on the float model).
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import _core
from ._gguf import GgufLinear
from ._int8 import Int8Linear
from ._modules import FP8Linear, Int4Linear


def _lora_class() -> type:
    from peft.tuners.lora.layer import Linear as LoraLinear

    class QuantizedLoraLinear(LoraLinear):
        """peft's LoRA ``Linear`` over a frozen quantized base layer; merging refuses."""

        def __init__(self, base_layer: Any, adapter_name: str, **kwargs: Any) -> None:
            # peft warns about every layer type it does not know by name; this one is
            # known here (in_features / out_features, forward with input gradients).
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Unsupported layer type", UserWarning)
                super().__init__(base_layer, adapter_name, **kwargs)

        def merge(self, *args: Any, **kwargs: Any) -> None:
            raise _core.UnsupportedOperation(
                f"merging a LoRA adapter into {type(self.get_base_layer()).__name__}: the "
                "packed weight is quantized and frozen, and re-quantizing W + BA would lose "
                "most of the adapter's update; keep the adapter unmerged, call unload() to "
                "drop it, or merge it into the float model (peft on the original nn.Linear) "
                "and quantize that"
            )

    return QuantizedLoraLinear


def peft_config(config: Any) -> Any:
    """``config`` (a ``peft.LoraConfig``) with ``Int4Linear`` / ``Int8Linear`` /
    ``FP8Linear`` / ``GgufLinear`` accepted as LoRA base layers; returns ``config``.
    Requires peft."""
    try:
        cls = _lora_class()
    except ImportError as e:  # peft is optional
        raise ImportError("quantrs.torch.peft_config needs peft (pip install peft)") from e
    if not hasattr(config, "_register_custom_module"):
        raise TypeError(f"peft_config: expected a peft.LoraConfig, got {type(config).__name__}")
    config._register_custom_module(
        {Int4Linear: cls, Int8Linear: cls, FP8Linear: cls, GgufLinear: cls}
    )
    return config
