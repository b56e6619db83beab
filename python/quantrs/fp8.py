"""OCP FP8 codecs (E4M3 as ``float8_e4m3fn``, and E5M2), backed by Rust SIMD kernels.

- ``encode(x, fmt="e4m3", saturate=False)`` -> uint8 codes, same shape as ``x``.
  Round to nearest, ties to even. ``saturate=False`` is bit-for-bit the
  ``ml_dtypes`` cast (``x.astype(float8_e4m3fn)``): overflow gives NaN for E4M3
  and inf for E5M2. ``saturate=True`` clamps finite overflow and +-inf to
  +-max (448 / 57344); NaN stays NaN. Inputs are read as float32 (float16
  converts exactly; float64 is rounded to float32 first).
- ``decode(codes, fmt="e4m3")`` -> float32.
- With ``ml_dtypes`` installed (optional): ``decode`` also accepts
  ``float8_e4m3fn`` / ``float8_e5m2`` arrays (read in place, the format taken
  from the dtype), ``encode(..., as_ml_dtypes=True)`` returns one, and
  ``view`` / ``codes`` convert between the two without copying.

The GIL is released while the kernels run; arrays above 128 Ki elements are
split across threads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._core import InvalidArgument
from ._core import fp8_decode as _decode
from ._core import fp8_encode as _encode

try:  # optional dependency
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - exercised only without ml_dtypes
    _ml = None

__all__ = ["FORMATS", "codes", "decode", "encode", "ml_dtype", "view"]

FORMATS = ("e4m3", "e5m2")
_ML_NAMES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_ALIASES = {
    "e4m3": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "e5m2": "e5m2",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
}


def _fmt(fmt: str) -> str:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt: expected str, got {type(fmt).__name__}")
    try:
        return _ALIASES[str(fmt).lower()]
    except KeyError:
        raise InvalidArgument(f"fmt: expected 'e4m3' or 'e5m2', got {fmt!r}") from None


def ml_dtype(fmt: str = "e4m3") -> np.dtype:
    """The ml_dtypes dtype of ``fmt`` (ImportError without ml_dtypes)."""
    if _ml is None:
        raise ImportError("ml_dtypes is not installed: pip install 'quantrs[fp8]'")
    return np.dtype(getattr(_ml, _ML_NAMES[_fmt(fmt)]))


def _float8_format(arr: Any) -> str | None:
    """'e4m3' / 'e5m2' when ``arr`` is an ml_dtypes float8 array, else None."""
    dt = getattr(arr, "dtype", None)
    if dt is None:
        return None
    for f, name in _ML_NAMES.items():
        if dt.name == name:
            return f
    return None


def _on_cuda(x: Any) -> bool:
    """A CUDA DLPack producer (DeviceArray, torch.cuda tensor, CuPy array)."""
    dev = getattr(x, "__dlpack_device__", None)
    return dev is not None and not isinstance(x, np.ndarray) and int(dev()[0]) == 2


def encode(x: Any, fmt: str = "e4m3", saturate: bool = False, *, as_ml_dtypes: bool = False):
    """Encode ``x`` to FP8 codes (uint8, or an ml_dtypes float8 view)."""
    f = _fmt(fmt)
    for arg, flag in (("saturate", saturate), ("as_ml_dtypes", as_ml_dtypes)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{arg}: expected bool, got {type(flag).__name__}")
    if _on_cuda(x):  # device arrays: the GPU codec (docs/gpu.md)
        from . import cuda

        return cuda.encode(x, f, bool(saturate))
    # NumPy's conversion turns 0-d inputs into 1-d: keep the caller's shape.
    out = _encode(x, f, bool(saturate)).reshape(np.shape(x))
    return out.view(ml_dtype(f)) if as_ml_dtypes else out


def decode(codes: Any, fmt: str | None = None) -> np.ndarray:
    """Decode FP8 codes (uint8, or an ml_dtypes float8 array) to float32."""
    if _on_cuda(codes):  # device arrays: the GPU codec (docs/gpu.md)
        from . import cuda

        return cuda.decode(codes, _fmt(fmt if fmt is not None else "e4m3"))
    from_dtype = _float8_format(codes)
    if from_dtype is not None:
        if fmt is not None and _fmt(fmt) != from_dtype:
            raise InvalidArgument(
                f"fmt: {fmt!r} contradicts the array's dtype {codes.dtype.name} ({from_dtype})"
            )
        return _decode(codes.view(np.uint8), from_dtype).reshape(np.shape(codes))
    out = _decode(codes, _fmt(fmt if fmt is not None else "e4m3"))
    return out.reshape(np.shape(codes))


def view(codes_u8: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
    """Zero-copy ml_dtypes view of uint8 codes."""
    a = np.asarray(codes_u8)
    if a.dtype != np.uint8:
        raise TypeError(f"codes: expected dtype uint8, got {a.dtype}")
    return a.view(ml_dtype(fmt))


def codes(arr: np.ndarray) -> np.ndarray:
    """Zero-copy uint8 view of an ml_dtypes float8 array."""
    if _float8_format(arr) is None:
        raise TypeError(
            f"arr: expected an ml_dtypes float8_e4m3fn / float8_e5m2 array, "
            f"got {getattr(arr, 'dtype', type(arr).__name__)}"
        )
    return arr.view(np.uint8)
