"""Quantization-aware training: ``QatOptimizer`` and its helpers.

AdamW updates full-precision master weights (float64 or float32, owned by
the caller and updated in place); after every step the optimizer re-derives
a fake-quantized view of them (int8 / int4 on a calibrated integer grid, or
a cast onto the FP8 E4M3 / E5M2 grid), which the forward pass uses. The
backward pass uses the straight-through estimator
(:func:`fake_quant_backward`). Everything numeric runs in Rust.

Example::

    import numpy as np
    import quantrs

    w = np.random.default_rng(0).standard_normal(1024)
    opt = quantrs.QatOptimizer(w, quantrs.QatConfig("int4", lr=1e-2), rng=0)
    for _ in range(100):
        wq = opt.quantized_weights  # forward with the quantized weights
        grad = 2 * (wq - 0.5)       # d loss / d wq, passed straight through
        opt.step(w, grad)           # w updated in place
"""

from __future__ import annotations

from typing import Union

import numpy as np

from ._core import (
    Int8Linear,
    InvalidArgument,
    PerTensorFP8Linear,
    QatConfig,
    QatOptimizer,
    QuantizedWeight,
    QuantParams,
    QuantScheme,
    QuantTarget,
    Rng,
    RoundingMode,
    qat_calibrate_per_channel,
    qat_fake_quant,
    qat_fake_quant_backward,
)

RngLike = Union[int, Rng, None]

__all__ = [
    "QatConfig",
    "QatOptimizer",
    "QuantParams",
    "QuantScheme",
    "QuantTarget",
    "Rng",
    "RoundingMode",
    "calibrate",
    "fake_quant",
    "fake_quant_backward",
    "fake_quant_deploy",
]

DEPLOY_TARGETS = ("int4", "int8", "fp8_e4m3")


def calibrate(
    x: np.typing.ArrayLike,
    target: str | QuantTarget = "int8",
    scheme: str | QuantScheme = "symmetric",
    *,
    clip_fraction: float = 0.0,
    axis: int | None = None,
) -> QuantParams | list[QuantParams]:
    """Integer quantization parameters for ``x``.

    Per tensor by default; ``axis`` (0 or 1 of a 2-D ``x``) gives one
    ``QuantParams`` per index along that axis. ``clip_fraction`` in
    ``[0, 0.5)`` switches to percentile calibration: the range is the
    ``clip_fraction`` / ``1 - clip_fraction`` quantiles of ``x`` (affine) or
    the ``1 - clip_fraction`` quantile of ``|x|`` (symmetric), with NumPy's
    linear interpolation. An all-zero (or empty) tensor has no scale and
    raises ``InvalidState``; non-finite values raise ``InvalidArgument``.
    """
    if axis is None:
        return QuantParams.calibrate(x, target, scheme, clip_fraction=clip_fraction)
    return qat_calibrate_per_channel(x, axis, target, scheme, clip_fraction)


def fake_quant(
    x: np.typing.ArrayLike,
    target: str | QuantTarget = "int8",
    scheme: str | QuantScheme = "symmetric",
    rounding: str | RoundingMode = "nearest",
    rng: RngLike = None,
    *,
    clip_fraction: float = 0.0,
    axis: int | None = None,
) -> np.ndarray:
    """Calibrate ``x`` (as :func:`calibrate`) and quantize-dequantize it.

    FP8 targets are a saturating cast onto the grid (NaN passes through), with
    no calibration. float32 input gives float32 output, anything else
    float64. Stochastic rounding with an int seed is reproducible; ``rng=None``
    draws fresh entropy.
    """
    return qat_fake_quant(x, target, scheme, rounding, rng, clip_fraction, axis)


def fake_quant_backward(
    grad: np.typing.ArrayLike, x: np.typing.ArrayLike, lo: float, hi: float
) -> np.ndarray:
    """Straight-through estimator: ``grad`` where ``lo <= x <= hi``, else 0.

    ``lo`` / ``hi`` are the representable range (``QuantParams.lo`` /
    ``QuantParams.hi``), in either order. NaN ``x`` gets a zero gradient.
    """
    return qat_fake_quant_backward(grad, x, lo, hi)


def fake_quant_deploy(w: np.typing.ArrayLike, target: str, group_size: int = 32) -> np.ndarray:
    """Quantize-dequantize a 2-D float32 weight ``[out, in]`` on the grid its serving
    layer stores: ``"int4"`` one absmax / 7 scale per ``group_size`` inputs of each output
    (``QuantizedWeight.quantize(..., method="rtn")``), ``"int8"`` one absmax / 127 scale
    per output channel (``Int8Linear.from_float``), ``"fp8_e4m3"`` one absmax / 448 scale per tensor
    (``PerTensorFP8Linear.from_float``). It is the serving format's own quantizer followed
    by its dequantizer, so the result is what the served layer computes with. With
    ``QatOptimizer``, use it on the master after each step as the forward weight
    (straight-through, as ``quantrs.torch.QatAdamW(grid="deploy")`` does)."""
    if target not in DEPLOY_TARGETS:
        raise InvalidArgument(
            f"fake_quant_deploy: target: expected one of {DEPLOY_TARGETS}, got {target!r}"
        )
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, int)
        or group_size < 2
        or group_size % 2
    ):
        raise InvalidArgument(
            f"fake_quant_deploy: group_size: expected an even int >= 2, got {group_size!r}"
        )
    a = np.asarray(w)
    if a.dtype != np.float32 or a.ndim != 2:
        raise InvalidArgument(
            "fake_quant_deploy: w: expected a 2-D float32 array [out, in], got "
            f"{a.dtype} of shape {a.shape}"
        )
    if target == "int4":
        # QAT trains on the round-to-nearest grid, so it deploys on that grid.
        qw = QuantizedWeight.quantize(
            np.ascontiguousarray(a.T), group_size=group_size, method="rtn"
        )
        return np.ascontiguousarray(qw.dequantize().T)
    layer = Int8Linear.from_float(a) if target == "int8" else PerTensorFP8Linear.from_float(a)
    return np.asarray(layer.dequantize_w(), np.float32)
