"""quantrs inside PyTorch: ``torch.optim`` optimizers with 4-bit or QAT state, and
quantized inference modules (docs/torch.md).

``import quantrs`` never imports torch; this subpackage does (``pip install
'quantrs[torch]'``). CPU tensors go to the kernels as zero-copy NumPy views; CUDA
tensors (4-bit optimizers and inference modules; docs/gpu.md) through DLPack, and raise
``quantrs.CudaNotAvailable`` with the reason where CUDA cannot be used.

- :class:`AdamW4bit`, :class:`Adam4bit`: ``torch.optim.Optimizer`` subclasses with packed
  4-bit moments (about 1 byte of state per parameter);
- :class:`QatAdamW`: quantization-aware training (float32 masters, fake-quantized
  parameters, on one per-tensor grid or on the serving layer's grid); :func:`convert_qat`
  swaps the trained linears for serving modules, :func:`prepare_w8a8` adds static FP8
  activation fake quantization; :func:`broadcast_views` after wrapping it in
  ``ZeroRedundancyOptimizer``;
- :class:`Int4Linear`, :class:`Int8Linear`, :class:`FP8Linear`, :func:`quantize_`: modules replacing
  ``nn.Linear``, with input gradients (:func:`peft_config`: peft LoRA on them);
  :func:`collect_importance`: each linear's mean input ``x^2`` (imatrix),
  :func:`collect_activation_ranges`: its largest input ``|x|`` (static W8A8 scales);
- :class:`GgufLinear`, :func:`load_gguf_llama`: GGUF block weights served packed;
  :func:`load_pretrained`: a whole GGUF / GPTQ / AWQ / FP8 / quantrs model in one call.
"""

from __future__ import annotations

from ._adam import Adam4bit, AdamW4bit
from ._convert import convert_qat
from ._gguf import GgufLinear, load_gguf_llama
from ._importance import collect_activation_ranges, collect_importance
from ._int8 import Int8Linear
from ._modules import FP8Linear, Int4Linear, default_filter, head_filter, quantize_
from ._peft import peft_config
from ._pretrained import load_pretrained
from ._qat import QatAdamW
from ._qat_act import FP8ActivationFakeQuant, prepare_w8a8
from ._zero import broadcast_views

__all__ = [
    "Adam4bit",
    "AdamW4bit",
    "FP8ActivationFakeQuant",
    "FP8Linear",
    "GgufLinear",
    "Int4Linear",
    "Int8Linear",
    "QatAdamW",
    "broadcast_views",
    "collect_activation_ranges",
    "collect_importance",
    "convert_qat",
    "default_filter",
    "head_filter",
    "load_gguf_llama",
    "load_pretrained",
    "peft_config",
    "prepare_w8a8",
    "quantize_",
]
