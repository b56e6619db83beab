"""The exceptions of :mod:`quantrs.formats`: one base, :class:`FormatError`, and one
subclass per kind of failure, each also the matching :class:`quantrs.QuantError`, so
``except FormatError``, ``except ValueError`` and ``except quantrs.QuantError`` all catch
them (docs/errors.md)."""

from __future__ import annotations

from .._core import InvalidArgument, QuantError, SerializationError, UnsupportedOperation


class FormatError(QuantError, ValueError):
    """A checkpoint cannot be read or written as asked (the message names the file or
    tensor and the reason). Only its subclasses are raised."""


class CorruptCheckpointError(FormatError, SerializationError):
    """The bytes or the folder are not what the format says: a truncated or malformed
    file, invalid JSON, an index that disagrees with its shards, a tensor of the wrong
    dtype or shape for the layer it belongs to."""


class UnsupportedFormatError(FormatError, UnsupportedOperation):
    """A valid file in a format or variant quantrs does not read, or a tensor quantrs
    cannot represent exactly (asymmetric zero points, per-channel FP8 scales without
    ``requantize=True``, a scale GGUF's F16 cannot hold)."""


class TensorNotFoundError(FormatError, InvalidArgument, KeyError):
    """The checkpoint holds no tensor (or layer) of the name asked for. Also a
    ``KeyError``, as a lookup by name is."""

    __str__ = BaseException.__str__  # the message as given, not KeyError's repr of it


class RequantizedWarning(UserWarning):
    """A tensor was dequantized and re-quantized (``requantize=True``): the values
    changed; the message gives the relative error."""
