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
    QuantizedWeight,
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
    "QuantizedWeight",
    "SerializationError",
    "UnsupportedOperation",
    "__version__",
    "build_info",
    "cuda_available",
    "reference",
]

# FP8 codecs (quantrs.fp8) and the QuantMethod linear layers.
from . import (
    fp8,  # noqa: E402
    reference,  # noqa: E402  (the NumPy oracles)
)
from ._core import Int4Linear, Int8Linear, PerTensorFP8Linear, UnquantLinear  # noqa: E402

__all__ += ["Int4Linear", "Int8Linear", "PerTensorFP8Linear", "UnquantLinear", "fp8"]
