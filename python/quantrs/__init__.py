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
from .qat import (
    QatConfig,
    QatOptimizer,
    QuantParams,
    QuantScheme,
    QuantTarget,
    Rng,
    RoundingMode,
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
    "QatConfig",
    "QatOptimizer",
    "QuantParams",
    "QuantScheme",
    "QuantTarget",
    "Rng",
    "RoundingMode",
]
