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
- ``QuantizedWeight.to("cuda")`` -> ``CudaQuantizedWeight``; every linear
  layer's ``.to("cuda")`` and ``apply_isq(..., device="cuda")`` ->
  ``CudaLinear``. Their calls take NumPy (result: NumPy), a ``DeviceArray``
  or any CUDA DLPack tensor such as a ``torch.cuda`` tensor or a CuPy array
  (read in place; result: ``DeviceArray``).
- ``encode`` / ``decode``: the FP8 codecs on CUDA arrays, bit-identical to
  :mod:`quantrs.fp8` (which dispatches here for CUDA inputs).
- ``AdamW4bit`` / ``Adam4bit``: the 4-bit optimizers with their state on a
  device, updating CUDA parameters in place, bit-identical to the CPU
  optimizers; ``opt.to("cuda")`` (or ``from_cpu(opt, device)``) and ``.to("cpu")`` move an optimizer
  with its state, and ``state_dict()`` / ``save_state`` write exactly the CPU
  format.
- ``QatOptimizer``: quantization-aware training's AdamW + fake-quantization step with
  the moments and the view on a device, float32 or float64 masters that are CUDA
  arrays (updated in place), bit-identical to ``quantrs.QatOptimizer``; ``to_bytes()``
  is exactly the CPU optimizer's, ``from_cpu`` / ``.to("cpu")`` move it with its state.
- ``calibrate``: ``quantrs.qat.calibrate`` of a CUDA array (min / max reduced on the
  device; the parameters are the CPU's).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _core
from ._core import CudaNotAvailable, GpuError

_HAS_GPU_BUILD = hasattr(_core, "DeviceArray")

if _HAS_GPU_BUILD:
    from ._core import CudaLinear, CudaQuantizedWeight, DeviceArray
else:  # pragma: no cover - a build without the `gpu` feature

    class _Unavailable:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")

        @staticmethod
        def from_numpy(*args: Any, **kwargs: Any) -> Any:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")

    DeviceArray = CudaQuantizedWeight = CudaLinear = _Unavailable  # type: ignore[misc,assignment]

__all__ = [
    "Adam4bit",
    "AdamW4bit",
    "QatOptimizer",
    "calibrate",
    "CudaLinear",
    "MemoryUsage",
    "CudaNotAvailable",
    "CudaQuantizedWeight",
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


class MemoryUsage(NamedTuple):
    """``memory_usage()`` of a device optimizer: elements and device bytes of the state
    (the fields of ``quantrs.StateMemoryStats``)."""

    momentum_elements: int
    variance_elements: int
    third_moment_elements: int
    total_bytes: int
    num_parameters: int


def _ordinal(device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    text = str(device)
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise _core.InvalidArgument(f"device: expected 'cuda', 'cuda:N' or an index, got {text!r}")


class _DeviceAdam:
    """The shared body of ``AdamW4bit`` and ``Adam4bit`` on a device: the CPU
    optimizer's methods, with parameters and gradients that are CUDA arrays
    (``DeviceArray``, ``torch.cuda`` tensors, CuPy arrays: float32, C-contiguous, on
    the optimizer's device; the parameter is updated in place, zero-copy)."""

    _cpu_cls: Any = None
    _kind = ""

    def __init__(
        self,
        learning_rate: float = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        device: Any = "cuda",
    ) -> None:
        cpu = self._cpu_cls(learning_rate, beta1, beta2, epsilon, weight_decay)
        self._engine = self._engine_of(cpu, device)

    @classmethod
    def _engine_of(cls, cpu: Any, device: Any) -> Any:
        if not _HAS_GPU_BUILD:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")
        return _core._CudaAdam(cpu.__getstate__(), cls._kind, _ordinal(device))

    @classmethod
    def with_quantization_config(
        cls, optimizer_config: Any = None, quantization_config: Any = None, *, device: Any = "cuda"
    ) -> Any:
        """Explicit hyper-parameters and state quantization, as the CPU classmethod."""
        return cls.from_cpu(
            cls._cpu_cls.with_quantization_config(optimizer_config, quantization_config), device
        )

    @classmethod
    def from_cpu(cls, optimizer: Any, device: Any = "cuda") -> Any:
        """The CPU optimizer ``optimizer`` (configuration, step count, state) on
        ``device``; ``optimizer`` is unchanged."""
        if not isinstance(optimizer, cls._cpu_cls):
            raise TypeError(
                f"optimizer: expected a quantrs.{cls._kind}, got {type(optimizer).__name__}"
            )
        obj = cls.__new__(cls)
        obj._engine = cls._engine_of(optimizer, device)
        return obj

    def cpu(self) -> Any:
        """A CPU optimizer with this configuration and a host copy of the state."""
        opt = self._cpu_cls()
        opt.__setstate__(self._engine.to_bytes())
        return opt

    def to(self, device: Any) -> Any:
        """``"cpu"``: :meth:`cpu`; this device: ``self``; another: a moved copy."""
        if str(device) == "cpu":
            return self.cpu()
        if f"cuda:{_ordinal(device)}" == self.device:
            return self
        return type(self).from_cpu(self.cpu(), device)

    @property
    def device(self) -> str:
        return str(self._engine.device)

    def update(self, param: Any, grad: Any, *, name: str | None = None) -> None:
        """One step of ``param`` (updated in place) with ``grad``."""
        self._engine.update(param, grad, name=name)

    def accumulate_grad(self, param: Any, grad: Any, *, name: str | None = None) -> None:
        self._engine.accumulate_grad(param, grad, name=name)

    def apply_accumulated_grads(self, accumulation_steps: int) -> None:
        self._engine.apply_accumulated_grads(accumulation_steps)

    def zero_grad(self) -> None:
        self._engine.zero_grad()

    def step(self) -> None:
        self._engine.step()

    def get_lr(self) -> float:
        return float(self._engine.get_lr())

    def set_lr(self, lr: float) -> None:
        self._engine.set_lr(lr)

    @property
    def lr(self) -> float:
        return self.get_lr()

    @lr.setter
    def lr(self, value: float) -> None:
        self.set_lr(value)

    # quantrs.torch's per-parameter state and hyper-parameter changes. They go through
    # a host copy of the state (validated by the CPU code); lr changes, the common case
    # under a scheduler, use set_lr and copy nothing.
    def export_param_state(self, name: str) -> tuple[int, dict[str, Any]]:
        """``(step, arrays)`` of parameter ``name``, as the CPU method (host copies)."""
        return self.cpu().export_param_state(name)

    def import_param_state(self, name: str, shape: Any, step: int, arrays: dict[str, Any]) -> None:
        """Replace the state by one parameter's, as the CPU method; on error nothing
        changes."""
        cpu = self.cpu()
        cpu.import_param_state(name, shape, step, arrays)
        self._engine.load_bytes(cpu.__getstate__())

    def set_hyper(
        self,
        learning_rate: float,
        beta1: float,
        beta2: float,
        epsilon: float,
        weight_decay: float,
    ) -> None:
        """Set every hyper-parameter at once (all or none change), as the CPU method."""
        cpu = self.cpu()
        cpu.set_hyper(learning_rate, beta1, beta2, epsilon, weight_decay)
        self._engine.load_bytes(cpu.__getstate__())

    def state_dict(self) -> dict[str, Any]:
        """The CPU optimizer's ``state_dict()`` of this state (NumPy arrays)."""
        return dict(self.cpu().state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace configuration and state (validated on the host first)."""
        cpu = self.cpu()
        cpu.load_state_dict(state)
        self._engine.load_bytes(cpu.__getstate__())

    def save_state(self, path: Any) -> None:
        self.cpu().save_state(path)

    def load_state(self, path: Any) -> None:
        cpu = self._cpu_cls()
        cpu.load_state(path)
        self._engine.load_bytes(cpu.__getstate__())

    def memory_usage(self) -> MemoryUsage:
        """Elements and device bytes of the state."""
        return MemoryUsage(*self._engine.memory_usage())

    def memory_savings(self) -> float:
        m = self.memory_usage()
        return 0.0 if m.num_parameters == 0 else 1.0 - m.total_bytes / (8.0 * m.num_parameters)

    def num_parameters(self) -> int:
        return int(self._engine.num_parameters())

    def reset_state(self) -> None:
        self._engine.reset_state()

    def config(self) -> Any:
        return self.cpu().config()

    def config_dict(self) -> dict[str, Any]:
        return dict(self.cpu().config_dict())

    def state(self) -> Any:
        return self.cpu().state()

    def __reduce__(self) -> Any:
        return (_restore, (type(self), self._engine.to_bytes(), self.device))

    def __repr__(self) -> str:
        cfg = self.config_dict()
        return (
            f"quantrs.cuda.{self._kind}(learning_rate={cfg['learning_rate']}, "
            f"method={cfg['method']!r}, device={self.device!r})"
        )


def _restore(cls: Any, state: bytes, device: str) -> Any:
    cpu = cls._cpu_cls()
    cpu.__setstate__(state)
    return cls.from_cpu(cpu, device)


class AdamW4bit(_DeviceAdam):
    """``quantrs.AdamW4bit`` with its state on a CUDA device (docs/gpu.md)."""

    _cpu_cls = _core.AdamW4bit
    _kind = "AdamW4bit"


class Adam4bit(_DeviceAdam):
    """``quantrs.Adam4bit`` with its state on a CUDA device (docs/gpu.md)."""

    _cpu_cls = _core.Adam4bit
    _kind = "Adam4bit"


def _host_copy(x: Any) -> Any:
    """A NumPy copy of an array on any device (DeviceArray, torch, CuPy, NumPy)."""
    import numpy as np

    if _HAS_GPU_BUILD and isinstance(x, DeviceArray):
        return x.numpy()
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch
        return x.detach().cpu().numpy()
    if hasattr(x, "get") and is_cuda_array(x):  # CuPy
        return x.get()
    return np.asarray(x)


def _cuda_device_of(x: Any, arg: str) -> int:
    if not is_cuda_array(x):
        raise _core.InvalidArgument(
            f"{arg}: expected a CUDA array (quantrs.cuda.DeviceArray, a torch.cuda tensor, a "
            "CuPy array); for a host array use quantrs.QatOptimizer and .to('cuda')"
        )
    return int(x.__dlpack_device__()[1])


class QatOptimizer:
    """``quantrs.QatOptimizer`` with its AdamW moments and fake-quantized view on a CUDA
    device (docs/gpu.md): ``QatOptimizer(master, config, rng=None)`` for a float32 or
    float64 CUDA ``master`` (the view is derived by the CPU code from a host copy, once),
    then ``step(master, grad, rng=None)`` updates the CUDA master in place with a CUDA
    gradient of the same dtype and shape, bit-identical to the CPU optimizer.
    ``quantized_weights`` is a ``DeviceArray`` over the optimizer's own buffer (every step
    rewrites it in place); ``moments()`` are device copies. ``to_bytes()`` / pickling are
    exactly the CPU optimizer's bytes."""

    def __init__(self, master: Any, config: Any, rng: Any = None) -> None:
        ordinal = _cuda_device_of(master, "master")
        cpu = _core.QatOptimizer(_host_copy(master), config, rng)
        self._engine = self._engine_of(cpu, ordinal)

    @staticmethod
    def _engine_of(cpu: Any, device: Any) -> Any:
        if not _HAS_GPU_BUILD:
            raise CudaNotAvailable("quantrs was built without the `gpu` feature")
        return _core._CudaQat(cpu.to_bytes(), cpu.shape, _ordinal(device))

    @classmethod
    def from_cpu(cls, optimizer: Any, device: Any = "cuda") -> QatOptimizer:
        """The CPU optimizer ``optimizer`` (configuration, step count, moments, view) on
        ``device``; ``optimizer`` is unchanged."""
        if not isinstance(optimizer, _core.QatOptimizer):
            raise TypeError(
                f"optimizer: expected a quantrs.QatOptimizer, got {type(optimizer).__name__}"
            )
        obj = cls.__new__(cls)
        obj._engine = cls._engine_of(optimizer, device)
        return obj

    @classmethod
    def from_bytes(cls, data: Any, shape: Any, device: Any = "cuda") -> QatOptimizer:
        """Rebuild from ``to_bytes()`` output (the CPU format) on ``device``."""
        return cls.from_cpu(_core.QatOptimizer.from_bytes(data, shape), device)

    def cpu(self) -> Any:
        """A ``quantrs.QatOptimizer`` with this configuration and a host copy of the state."""
        return _core.QatOptimizer.from_bytes(self._engine.to_bytes(), self.shape)

    def to(self, device: Any) -> Any:
        """``"cpu"``: :meth:`cpu`; this device: ``self``; another: a moved copy."""
        if str(device) == "cpu":
            return self.cpu()
        if f"cuda:{_ordinal(device)}" == self.device:
            return self
        return type(self).from_cpu(self.cpu(), device)

    def step(self, master: Any, grad: Any, rng: Any = None) -> None:
        """One AdamW step on ``master`` in place, then a new view. Transactional: on
        error (a non-finite gradient or master, an overflowing update, a degenerate
        calibration) master, moments, step count and view are unchanged."""
        self._engine.step(master, grad, rng)

    @property
    def quantized_weights(self) -> Any:
        return self._engine.quantized_weights

    def quant_params(self) -> Any:
        return self._engine.quant_params()

    def step_count(self) -> int:
        return int(self._engine.step_count())

    @property
    def config(self) -> Any:
        return self._engine.config

    @property
    def dtype(self) -> str:
        return str(self._engine.dtype_name)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._engine.shape)

    @property
    def seed(self) -> int:
        return int(self._engine.seed)

    @property
    def device(self) -> str:
        return str(self._engine.device)

    def moments(self) -> tuple[Any, Any]:
        """Device copies of the AdamW moments ``(m, v)`` (``DeviceArray``)."""
        return self._engine.moments()

    def to_bytes(self) -> bytes:
        """Exactly ``quantrs.QatOptimizer.to_bytes()`` of this state."""
        return bytes(self._engine.to_bytes())

    def memory_usage(self) -> int:
        """Device bytes held: moments, view and the step's scratch."""
        return int(self._engine.memory_usage())

    def set_hyper(
        self, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float
    ) -> None:
        """Set all five AdamW hyper-parameters (validated first; all or none change)."""
        self._engine.set_hyper(lr, beta1, beta2, eps, weight_decay)

    def set_lr(self, lr: float) -> None:
        c = self.config
        self.set_hyper(lr, c.beta1, c.beta2, c.eps, c.weight_decay)

    def set_betas(self, beta1: float, beta2: float) -> None:
        c = self.config
        self.set_hyper(c.lr, beta1, beta2, c.eps, c.weight_decay)

    def set_eps(self, eps: float) -> None:
        c = self.config
        self.set_hyper(c.lr, c.beta1, c.beta2, eps, c.weight_decay)

    def set_weight_decay(self, weight_decay: float) -> None:
        c = self.config
        self.set_hyper(c.lr, c.beta1, c.beta2, c.eps, weight_decay)

    def set_rounding(self, rounding: Any) -> None:
        self._engine.set_rounding(rounding)

    def set_seed(self, seed: int) -> None:
        self._engine.set_seed(seed)

    def set_moments(self, step: int, m: Any, v: Any) -> None:
        """Replace the step count and the moments (any arrays of the master's shape and
        dtype; validated by the CPU code on host copies; unchanged on error)."""
        cpu = self.cpu()
        cpu.set_moments(step, _host_copy(m), _host_copy(v))
        self._engine.load_bytes(cpu.to_bytes())

    def __len__(self) -> int:
        return len(self._engine)

    def __reduce__(self) -> Any:
        return (QatOptimizer.from_bytes, (self.to_bytes(), self.shape, self.device))

    def __repr__(self) -> str:
        return (
            f"quantrs.cuda.QatOptimizer(shape={self.shape}, dtype={self.dtype!r}, "
            f"target={self.config.target.value!r}, device={self.device!r})  "
            f"# step_count={self.step_count()}"
        )


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
