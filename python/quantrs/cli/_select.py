"""Which tensors ``quantrs quantize`` quantizes.

Default: the 2-D floating weights of linear layers, i.e. tensors named ``<module>.weight``
(F32, F16, BF16, F64, no zero dimension) whose module is not an embedding, an output
head or a norm: the last module name must not contain ``embed`` or ``norm`` and must not
be ``lm_head``, ``wte``, ``wpe`` or start with ``ln_``. Everything else (biases, norms,
embeddings, ``lm_head``, 1-D and integer tensors) is copied unchanged.

In a GGUF file (``quantrs quantize IN.gguf OUT.gguf``, llama.cpp's tensor names) the same
layers are chosen by :func:`not_block_linear`: the 2-D ``blk.<i>.<x>.weight`` tensors whose
``<x>`` is not a norm (``attn_q``, ``attn_k``, ``attn_v``, ``attn_output``, ``ffn_gate``,
``ffn_up``, ``ffn_down``, ...); ``token_embd``, ``output`` (the head), the norms and every
1-D or 3-D tensor are copied.

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


def not_block_linear(name: str) -> str | None:
    """Why the GGUF tensor ``name`` is not the weight of a block's linear layer (None
    when it is): llama.cpp names those ``blk.<i>.<x>.weight``."""
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit() or parts[3] != "weight":
        return "not a block weight (blk.N.*.weight)"
    if "norm" in parts[2]:
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
        return self._decide(t.name, not_quantizable(t), not_linear)

    def choose_gguf(self, name: str, n_dims: int) -> tuple[bool, str]:
        """``choose`` for a GGUF tensor of ``n_dims`` dimensions (llama.cpp's names);
        whether its ggml type can be decoded is for the caller to say."""
        return self._decide(name, None if n_dims == 2 else f"{n_dims}-D", not_block_linear)

    def _decide(self, name: str, why: str | None, default_rule) -> tuple[bool, str]:
        if self.include:
            if not any(fnmatchcase(name, g) for g in self.include):
                return False, "not matched by --include"
        elif why is None:
            why = default_rule(name)
        if why is None and any(fnmatchcase(name, g) for g in self.exclude):
            why = "matched by --exclude"
        return why is None, why or ""

    def describe(self) -> dict:
        return {"include": self.include or None, "exclude": self.exclude or None}
