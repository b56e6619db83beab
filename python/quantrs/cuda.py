"""quantrs on NVIDIA GPUs (docs/gpu.md).

One wheel serves machines with and without a GPU: whether CUDA can be used
is decided when it is first asked for (``is_available()``; the NVIDIA driver
loads, a device exists, its compute capability is 7.0 or newer). Kernels are
compiled with NVRTC for the device on first use; NVRTC comes from the
system or from PyPI's ``nvidia-cuda-nvrtc`` wheel (found automatically), or
``QUANTRS_NVRTC`` names the library.

- ``DeviceArray``: device memory without a framework (``from_numpy``,
  ``numpy()``, ``__dlpack__`` so ``torch.from_dlpack`` / ``cupy.from_dlpack``
  take it zero-copy).
- ``QuantizedWeight.to("cuda")`` and every linear layer's ``.to("cuda")`` /
  ``apply_isq(..., device="cuda")`` give the same class placed on the device:
  ``matvec`` / ``matmul`` / ``forward`` take NumPy (result: NumPy), a
  ``DeviceArray`` or any CUDA DLPack tensor such as a ``torch.cuda`` tensor or a
  CuPy array (read in place; result: ``DeviceArray``).
- ``encode`` / ``decode``: the FP8 codecs on CUDA arrays, bit-identical to
  :mod:`quantrs.fp8` (which dispatches here for CUDA inputs).
- The optimizers are the package's own classes: ``quantrs.AdamW4bit``,
  ``quantrs.Adam4bit`` and ``quantrs.QatOptimizer`` move their state with
  ``opt.to("cuda")`` / ``opt.to("cpu")`` (in place) and then update CUDA
  arrays in place, bit-identical to the CPU.
- ``calibrate``: ``quantrs.qat.calibrate`` of a CUDA array (min / max reduced on the
  device; the parameters are the CPU's).
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._core import CudaNotAvailable, GpuError

_HAS_GPU_BUILD = hasattr(_core, "DeviceArray")

if _HAS_GPU_BUILD:
    from ._core import DeviceArray
else:  # pragma: no cover - a build without the `gpu` feature

    class _Unavailable:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")

        @staticmethod
        def from_numpy(*args: Any, **kwargs: Any) -> Any:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")

    DeviceArray = _Unavailable  # type: ignore[misc,assignment]

__all__ = [
    "calibrate",
    "CudaNotAvailable",
    "DeviceArray",
    "GpuError",
    "decode",
    "device_count",
    "device_info",
    "encode",
    "is_available",
    "is_cuda_array",
    "unavailable_reason",
]


def is_available() -> bool:
    """Whether CUDA device 0 can be used (same as ``quantrs.cuda_available()``)."""
    return _core.cuda_available()


def unavailable_reason() -> str | None:
    """Why CUDA cannot be used, or None when it can."""
    if not _HAS_GPU_BUILD:
        return "quantrs was built without the `gpu` feature"
    return _core.cuda_unavailable_reason()


def device_count() -> int:
    """Number of CUDA devices the driver sees (0 without a driver)."""
    return _core.cuda_device_count() if _HAS_GPU_BUILD else 0


def device_info(device: int = 0) -> dict[str, Any]:
    """Name, compute capability, memory and NVRTC version of ``device``."""
    if not _HAS_GPU_BUILD:
        raise CudaNotAvailable("quantrs was built without the `gpu` feature")
    return dict(_core.cuda_device_info(device))


def is_cuda_array(x: Any) -> bool:
    """True for a ``DeviceArray`` or any DLPack producer on a CUDA device."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or not hasattr(x, "__dlpack__"):
        return False
    try:
        return int(dev()[0]) == 2  # kDLCUDA
    except Exception:  # a producer whose __dlpack_device__ fails is not one
        return False


def encode(x: Any, fmt: str = "e4m3", saturate: bool = False) -> DeviceArray:
    """FP8 codes (uint8 ``DeviceArray``) of a CUDA float32 array."""
    if not _HAS_GPU_BUILD:
        raise CudaNotAvailable("quantrs was built without the `gpu` feature")
    return _core.cuda_fp8_encode(x, fmt, bool(saturate))


def decode(codes: Any, fmt: str = "e4m3") -> DeviceArray:
    """float32 ``DeviceArray`` of CUDA uint8 FP8 codes."""
    if not _HAS_GPU_BUILD:
        raise CudaNotAvailable("quantrs was built without the `gpu` feature")
    return _core.cuda_fp8_decode(codes, fmt)


def calibrate(
    x: Any,
    target: Any = "int8",
    scheme: Any = "symmetric",
    *,
    clip_fraction: float = 0.0,
    axis: int | None = None,
) -> Any:
    """``quantrs.qat.calibrate`` of a CUDA float32 / float64 array: the same parameters
    (per tensor, or per channel along ``axis`` of a 2-D ``x``). Min / max are reduced on
    the device; percentile calibration (``clip_fraction > 0``) and error reports read a
    host copy."""
    if not _HAS_GPU_BUILD:
        raise CudaNotAvailable("quantrs was built without the `gpu` feature")
    return _core.cuda_qat_calibrate(x, target, scheme, float(clip_fraction), axis)
