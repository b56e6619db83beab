"""Checkpoints other tools write, read into quantrs, and files other tools read
(docs/checkpoints.md):

- :func:`load_gptq`, :func:`load_awq`: a GPTQ / AWQ (GEMM) 4-bit layer of a
  safetensors file or Hugging Face model folder as an ``Int4Linear``;
- :func:`load_gguf` / :func:`save_gguf`: GGUF ``Q4_0`` tensors as ``QuantizedWeight``
  and back;
- :func:`load_fp8`: a per-tensor FP8 layer in any producer's dialect as a
  ``PerTensorFP8Linear`` (per-channel / block scales re-quantized on request);
- :class:`Checkpoint`: the tensors of a file or (sharded) model folder, validated.

Exact where the format allows; anything else raises a :class:`FormatError` (a
``quantrs.QuantError``: :class:`CorruptCheckpointError`, :class:`UnsupportedFormatError`
or :class:`TensorNotFoundError`) naming the tensor and the reason, or with
``requantize=True`` is dequantized and re-quantized with a :class:`RequantizedWarning`
giving the error.
"""

from __future__ import annotations

from ._checkpoint import Checkpoint
from ._errors import (
    CorruptCheckpointError,
    FormatError,
    RequantizedWarning,
    TensorNotFoundError,
    UnsupportedFormatError,
)
from .awq import load_awq
from .fp8 import load_fp8
from .gguf import GgufFile, load_gguf
from .gguf_write import save_gguf
from .gptq import load_gptq

__all__ = [
    "Checkpoint",
    "CorruptCheckpointError",
    "FormatError",
    "GgufFile",
    "RequantizedWarning",
    "TensorNotFoundError",
    "UnsupportedFormatError",
    "load_awq",
    "load_fp8",
    "load_gguf",
    "load_gptq",
    "save_gguf",
]
