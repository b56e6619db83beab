"""quantrs: low-bit training and inference on NumPy arrays, with a Rust core.

Every public type is importable from here; FP8 codecs live in
:mod:`quantrs.fp8`, QAT helpers in :mod:`quantrs.qat` (re-exported here), and
the pure-NumPy oracles the tests use in :mod:`quantrs.reference`.
"""

from . import fp8, qat, reference
from ._core import (
    Adam4bit,
    Adam4bitConfig,
    Adam4bitOptimizerConfig,
    AdamW4bit,
    AdvancedQuantizationConfig,
    CudaNotAvailable,
    DimensionMismatch,
    GgufWeight,
    GpuError,
    Int4AsymWeight,
    Int4KWeight,
    Int4Linear,
    Int8Linear,
    IntZpWeight,
    InvalidArgument,
    InvalidState,
    OptimizerState,
    PerTensorFP8Linear,
    QuantError,
    QuantizationMethod,
    QuantizedWeight,
    QuantLinear,
    SerializationError,
    StateMemoryStats,
    UnquantLinear,
    UnsupportedOperation,
    __version__,
    build_info,
    cuda_available,
    num_threads,
    threads,
)
from ._foreign_threads import foreign_threads
from ._gptq import gptq
from .qat import *  # noqa: F403 (the QAT API, listed in qat.__all__)

__all__ = [
    # errors
    "CudaNotAvailable",
    "DimensionMismatch",
    "GpuError",
    "InvalidArgument",
    "InvalidState",
    "QuantError",
    "SerializationError",
    "UnsupportedOperation",
    # INT4 weights and the QuantMethod layers
    "GgufWeight",
    "Int4AsymWeight",
    "Int4KWeight",
    "Int4Linear",
    "Int8Linear",
    "IntZpWeight",
    "PerTensorFP8Linear",
    "QuantLinear",
    "QuantizedWeight",
    "UnquantLinear",
    # GPTQ into the INT4 formats (docs/int4.md "GPTQ")
    "gptq",
    # 4-bit Adam / AdamW
    "Adam4bit",
    "Adam4bitConfig",
    "Adam4bitOptimizerConfig",
    "AdamW4bit",
    "AdvancedQuantizationConfig",
    "OptimizerState",
    "QuantizationMethod",
    "StateMemoryStats",
    # modules and build information
    "__version__",
    "build_info",
    "cuda_available",
    "fp8",
    # the small-batch kernels' thread cap (docs/int4.md, "Threads")
    "num_threads",
    "threads",
    # other libraries' BLAS / OpenMP pools around a decode loop (docs/int4.md, "Threads")
    "foreign_threads",
    "qat",
    "reference",
]
__all__ += qat.__all__  # quantization-aware training
