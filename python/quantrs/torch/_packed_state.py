"""The parts of a packed Rust weight (``Int4AsymWeight``, ``Int4KWeight``,
``IntZpWeight``) as the arrays a ``GgufLinear`` puts in its ``state_dict`` and pickles,
and the weight rebuilt from them (docs/torch.md "GGUF models").

The weight itself stays in the Rust object, held once: the arrays are made when the
state is exported, as ``torch.ao``'s quantized linears export their packed parameters.
The parts are those of quantrs' own safetensors layout (docs/checkpoints.md; 4-bit codes
packed two per byte, halves as float16), so a ``state_dict`` is about the size of the
packed weight, and rebuilding goes through the weight's own ``from_parts``, which checks
every part.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from .. import Int4AsymWeight, Int4KWeight, IntZpWeight, _core
from ..formats.own_layout import pack_runs, pack_six, unpack_runs, unpack_six

PackedWeight = Int4AsymWeight | Int4KWeight | IntZpWeight


def parts_of(weight: PackedWeight) -> dict[str, np.ndarray]:
    """The named arrays that :func:`rebuild` turns back into ``weight``."""
    if isinstance(weight, Int4KWeight):
        return {
            "codes": pack_runs(weight.codes()),
            "scale_codes": pack_six(np.array(weight.scale_codes())),
            "supers": weight.supers().astype(np.float16),
        }
    if isinstance(weight, Int4AsymWeight):
        return {"codes": pack_runs(weight.codes()), "scales": weight.scales().astype(np.float16)}
    codes = weight.codes()
    parts = {
        "codes": pack_runs(codes) if weight.bits == 4 else codes,
        "scales": weight.scales().astype(np.float16),
        "zeros": np.array(weight.zeros()),
    }
    if weight.perm is not None:
        parts["perm"] = np.asarray(weight.perm, np.int64)
    return parts


def layout_of(weight: PackedWeight) -> tuple[str, int, int]:
    """What :func:`rebuild` needs beside the parts: ``(type, group_size, bits)``."""
    return weight.type, weight.group_size, getattr(weight, "bits", 4)


def rebuild(layout: tuple[str, int, int], parts: dict[str, np.ndarray]) -> PackedWeight:
    """A weight of ``layout`` (:func:`layout_of`) from ``parts`` (arrays of
    :func:`parts_of`'s names); raises the weight's own ``QuantError`` when a part is not
    valid."""
    kind, group_size, bits = layout
    if kind == "int4_k":
        codes = unpack_runs(parts["codes"])
        groups = codes.shape[1] // 32
        six = unpack_six(parts["scale_codes"], 2 * groups).reshape(-1, groups, 2)
        return Int4KWeight.from_parts(codes, six, parts["supers"].astype(np.float32))
    if kind == "int4_asym":
        return Int4AsymWeight.from_parts(
            unpack_runs(parts["codes"]),
            parts["scales"].astype(np.float32),
            group_size=group_size,
        )
    return IntZpWeight.from_parts(
        unpack_runs(parts["codes"]) if bits == 4 else parts["codes"],
        parts["scales"],
        parts["zeros"],
        group_size=group_size,
        bits=bits,
        perm=parts.get("perm"),
    )


def pickled(weight: PackedWeight) -> tuple[tuple[str, int, int], dict[str, np.ndarray]]:
    """What a pickled ``GgufLinear`` holds for ``weight``: its layout and parts."""
    return layout_of(weight), parts_of(weight)


def unpickled(state: tuple[tuple[str, int, int], dict[str, np.ndarray]]) -> PackedWeight:
    """The inverse of :func:`pickled`."""
    return rebuild(*state)


def load_parts(
    like: PackedWeight, state_dict: dict, prefix: str, missing_keys: list[str]
) -> PackedWeight | None:
    """The weight that ``state_dict``'s entries ``prefix + part`` give (popped from it),
    or None when a part is missing (its key added to ``missing_keys``). An entry of
    another shape or dtype raises ``DimensionMismatch``, invalid values the weight's
    own ``QuantError``, each naming the key; nothing is changed on error."""
    want = parts_of(like)
    keys = {name: prefix + name for name in want}
    absent = [k for k in keys.values() if k not in state_dict]
    if absent:
        missing_keys.extend(absent)
        for key in keys.values():  # the parts that are there are not unexpected
            state_dict.pop(key, None)
        return None
    got = {}
    for name, ref in want.items():
        key = keys[name]
        t = state_dict[key]
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else None
        if a is None or a.shape != ref.shape or a.dtype != ref.dtype:
            what = "not a tensor" if a is None else f"{a.dtype} {list(a.shape)}"
            raise _core.DimensionMismatch(
                f"{key}: expected a {ref.dtype} tensor of shape {list(ref.shape)}, got {what}"
            )
        got[name] = np.ascontiguousarray(a)
    try:
        weight = rebuild(layout_of(like), got)
    except _core.QuantError as e:
        # The weight's constructor names the argument ("supers: row 0 ... is inf"): the
        # part, whose key is named here.
        part = next((n for n in want if re.search(rf"\b{n}\b", str(e))), None)
        key = prefix + part if part else ", ".join(keys.values())
        raise type(e)(f"{key}: {e}") from None
    for key in keys.values():
        state_dict.pop(key)
    return weight
