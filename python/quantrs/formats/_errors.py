"""The one exception of :mod:`quantrs.formats`."""

from __future__ import annotations


class FormatError(ValueError):
    """A checkpoint cannot be read or written as asked: a corrupt or truncated file,
    an inconsistent model folder, or a tensor whose format quantrs cannot represent
    exactly (the message names the tensor and the reason)."""


class RequantizedWarning(UserWarning):
    """A tensor was dequantized and re-quantized (``requantize=True``): the values
    changed; the message gives the relative error."""
