"""Which GGUF tensor is which PyTorch linear: transformers' GGUF tensor-name mapping
(``get_gguf_hf_weights_map``, the reference for GGUF names) applied to a model built from
the file's config, for the architectures whose linears transformers loads unchanged
(qwen2, qwen3) or with llama.cpp's q / k row interleave undone (llama, which llama.cpp
also uses for Mistral models). Shared by :func:`quantrs.torch.load_pretrained` on a
``.gguf`` file and by ``quantrs convert FILE.gguf FOLDER``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from torch import nn

from ..formats import GgufFile, UnsupportedFormatError

# general.architecture -> whether attn_q / attn_k rows are stored interleaved (llama.cpp's
# convert_hf_to_gguf permutes them for llama; transformers' LlamaTensorProcessor undoes it)
GGUF_ARCHITECTURES = {"llama": True, "qwen2": False, "qwen3": False}


def gguf_architecture(g: GgufFile) -> str:
    """The file's ``general.architecture``, or :class:`UnsupportedFormatError` naming the
    supported ones."""
    arch = g.metadata.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedFormatError(
            f"{g.path}: GGUF architecture {arch!r}; the whole-model GGUF loader reads "
            f"{', '.join(repr(a) for a in GGUF_ARCHITECTURES)} (transformers' tensor names)"
        )
    return arch


def llama_row_order(out_features: int, n_head: int) -> np.ndarray:
    """Indices ``p`` with ``W_hf = W_file[p]`` for a q / k projection: the inverse of
    llama.cpp's per-head interleave of the rotary halves, as transformers undoes it."""
    dim = out_features // n_head // 2
    return np.arange(out_features).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(-1)


def gguf_config(path: str | os.PathLike):
    """The transformers config transformers reads from the GGUF file's metadata."""
    from transformers import AutoConfig

    p = Path(path)
    return AutoConfig.from_pretrained(p.parent, gguf_file=p.name)


def tensor_map(model: nn.Module, arch: str) -> dict[str, tuple[str, int | None]]:
    """GGUF tensor name -> (the model's parameter name, the head count whose interleave
    its rows carry, or None), from transformers' mapping for ``model`` (its config's
    architecture; a meta-device model will do)."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    names = get_gguf_hf_weights_map(model, TensorProcessor())
    cfg = model.config
    out = {}
    for gguf_name, hf_name in names.items():
        heads = None
        if GGUF_ARCHITECTURES[arch]:
            if ".attn_q." in gguf_name:
                heads = cfg.num_attention_heads
            elif ".attn_k." in gguf_name:
                heads = cfg.num_key_value_heads
        out[gguf_name] = (hf_name, heads)
    return out


def row_order(rows: int, heads: int | None) -> np.ndarray | None:
    """The row order of a tensor with ``rows`` output rows (see :func:`tensor_map`)."""
    return None if heads is None else llama_row_order(rows, heads)
