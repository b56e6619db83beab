"""quantrs: low-bit training and inference on NumPy arrays, with a Rust core.

Every public type is importable from here; FP8 codecs live in
:mod:`quantrs.fp8`, QAT helpers in :mod:`quantrs.qat`, and the pure-NumPy
oracles the tests use in :mod:`quantrs.reference`.
"""

from ._core import (
    CudaNotAvailable,
    DimensionMismatch,
    GpuError,
    InvalidArgument,
    InvalidState,
    QuantError,
    SerializationError,
    UnsupportedOperation,
    __version__,
    build_info,
    cuda_available,
)

__all__ = [
    "CudaNotAvailable",
    "DimensionMismatch",
    "GpuError",
    "InvalidArgument",
    "InvalidState",
    "QuantError",
    "SerializationError",
    "UnsupportedOperation",
    "__version__",
    "build_info",
    "cuda_available",
]

# 4-bit Adam / AdamW (SPEC section 6).
from ._core import (  # noqa: E402
    Adam4bit,
    Adam4bitOptimizerConfig,
    AdamW4bit,
    AdvancedQuantizationConfig,
    OptimizerState,
    QuantizationMethod,
    StateMemoryStats,
)

__all__ += [
    "Adam4bit",
    "Adam4bitOptimizerConfig",
    "AdamW4bit",
    "AdvancedQuantizationConfig",
    "OptimizerState",
    "QuantizationMethod",
    "StateMemoryStats",
]
