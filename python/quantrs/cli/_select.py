"""Which tensors ``quantrs quantize`` quantizes.

Default: the 2-D floating weights of linear layers, i.e. tensors named ``<module>.weight``
(F32, F16, BF16, F64, no zero dimension) whose module is not an embedding, an output
head or a norm: the last module name must not contain ``embed`` or ``norm`` and must not
be ``lm_head``, ``wte``, ``wpe`` or start with ``ln_``. Everything else (biases, norms,
embeddings, ``lm_head``, 1-D and integer tensors) is copied unchanged.

``--include GLOB`` (repeatable) replaces the default rule: a tensor is chosen when its
name matches one of the patterns (``fnmatch``, case-sensitive; ``*`` matches dots too).
``--exclude GLOB`` then removes matches. A chosen tensor that is not a non-empty 2-D
float tensor is copied, and the report says why.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from ..formats._stfile import FLOAT_DTYPES, TensorInfo

_HEADS = ("lm_head", "wte", "wpe")


def not_linear(name: str) -> str | None:
    """Why ``name`` is not the weight of a linear layer (None when it is)."""
    if name != "weight" and not name.endswith(".weight"):
        return "not a .weight"
    module = name[: -len("weight")].rstrip(".").rsplit(".", 1)[-1].lower()
    if "embed" in module:
        return "embedding"
    if module in _HEADS:
        return "output head / embedding"
    if "norm" in module or module.startswith("ln_"):
        return "norm"
    return None


def not_quantizable(t: TensorInfo) -> str | None:
    """Why ``t`` cannot be quantized at all (None when it can)."""
    if t.dtype not in FLOAT_DTYPES:
        return f"{t.dtype} is not a float dtype"
    if len(t.shape) != 2:
        return f"{len(t.shape)}-D"
    if min(t.shape) == 0:
        return "empty"
    return None


class Selector:
    """``choose(t)`` -> ``(quantize?, reason it is copied or "")``."""

    def __init__(self, include: list[str] | None = None, exclude: list[str] | None = None):
        self.include = list(include or [])
        self.exclude = list(exclude or [])

    def choose(self, t: TensorInfo) -> tuple[bool, str]:
        why = not_quantizable(t)
        if self.include:
            if not any(fnmatchcase(t.name, g) for g in self.include):
                return False, "not matched by --include"
        elif why is None:
            why = not_linear(t.name)
        if why is None and any(fnmatchcase(t.name, g) for g in self.exclude):
            why = "matched by --exclude"
        return why is None, why or ""

    def describe(self) -> dict:
        return {"include": self.include or None, "exclude": self.exclude or None}
