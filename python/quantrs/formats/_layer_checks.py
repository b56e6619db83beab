"""The checks GPTQ and AWQ layers share: the three packed tensors of a layer, and the
group size that fits their shapes."""

from __future__ import annotations

from ._checkpoint import Checkpoint
from ._errors import CorruptCheckpointError, TensorNotFoundError
from ._stfile import TensorInfo


def packed_tensors(
    ck: Checkpoint, prefix: str, what: str, scale_dtypes: tuple[str, ...]
) -> tuple[TensorInfo, TensorInfo, TensorInfo]:
    """``qweight``, ``qzeros`` (2-D I32) and ``scales`` (2-D, one of ``scale_dtypes``) of
    layer ``prefix``."""
    for k in ("qweight", "qzeros", "scales"):
        if f"{prefix}.{k}" not in ck:
            raise TensorNotFoundError(f"{what}: missing tensor {prefix + '.' + k!r}")
    tq, tz, ts = (ck.info(f"{prefix}.{k}") for k in ("qweight", "qzeros", "scales"))
    for t, dts in ((tq, ("I32",)), (tz, ("I32",)), (ts, scale_dtypes)):
        if t.dtype not in dts or len(t.shape) != 2:
            raise CorruptCheckpointError(
                f"tensor {t.name!r}: expected a 2-D {' or '.join(dts)} tensor, "
                f"got {t.dtype} {list(t.shape)}"
            )
    return tq, tz, ts


def group_size_of(what: str, in_feat: int, groups: int, configured: int) -> int:
    """The group size of a layer with ``groups`` scale rows for ``in_feat`` inputs:
    ``configured`` when it is positive, else (-1: one group over all inputs; absent:
    unknown) the one the shapes imply."""
    if groups < 1 or groups > in_feat:
        raise CorruptCheckpointError(f"{what}: {groups} groups for {in_feat} inputs")
    gs = configured
    if gs <= 0:
        gs = in_feat if groups == 1 else -(-in_feat // groups)
    if -(-in_feat // gs) != groups:
        raise CorruptCheckpointError(
            f"{what}: {groups} groups do not fit {in_feat} inputs in groups of {gs}"
        )
    return gs
