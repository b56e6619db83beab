"""The ggml block types quantrs quantizes float weights to (``GgufWeight.quantize``),
and which one a weight gets when its input width does not fit the asked type's block:
the rule shared by ``quantrs quantize --format q4_k`` and ``quantize_(model, "q4_k")``
(docs/formats.md "Quantizing from float").

The fallback is llama.cpp's (``tensor_type_fallback`` in ``src/llama-quant.cpp``, commit
0c1e570 of October 2026): a k-quant (blocks of 256) on a row whose width is not a multiple
of 256 becomes the 32-block type of about its size, ``q4_k -> q5_0``, ``q5_k -> q5_1``,
``q6_k -> q8_0``; a width that is not a multiple of 32 fits no block type, and llama.cpp
stores the tensor as F16. quantrs then keeps the float weight as it is (a copied tensor,
an ``nn.Linear`` left alone) and says so in the report.
"""

from __future__ import annotations

from .gguf import GGML_TYPES

# the types GgufWeight.quantize writes, in the order the docs list them
QUANTIZE_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
# llama.cpp's tensor_type_fallback for the k-quants
_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
# ggml type name (lower case) -> (weights per block, bytes per block)
_BLOCKS = {name.lower(): (n, b) for name, n, b in GGML_TYPES.values()}


def block_of(gtype: str) -> tuple[int, int]:
    """``(weights, bytes)`` of one block of ggml type ``gtype`` (``"q4_k"``: 256, 144)."""
    return _BLOCKS[gtype]


def bits_per_weight(gtype: str) -> float:
    """Bits per weight of ``gtype``, scales included (``q4_k``: 4.5)."""
    n, b = _BLOCKS[gtype]
    return 8 * b / n


def type_for(gtype: str, in_features: int) -> str | None:
    """The type a weight of ``in_features`` inputs gets when ``gtype`` is asked: ``gtype``
    where its block divides the inputs, else llama.cpp's fallback where that one's does,
    else None (keep the float weight; llama.cpp writes F16)."""
    for t in (gtype, _FALLBACK.get(gtype)):
        if t is not None and in_features > 0 and in_features % _BLOCKS[t][0] == 0:
            return t
    return None


def fallback_note(gtype: str, used: str | None, in_features: int) -> str:
    """The report's reason for a weight that does not get ``gtype`` ('' when it does)."""
    if used == gtype:
        return ""
    need = _BLOCKS[gtype][0]
    if used is None:
        return f"{in_features} inputs, not a multiple of 32: kept float (llama.cpp: F16)"
    return f"{gtype} fallback: {in_features} inputs, not a multiple of {need} (llama.cpp's rule)"
