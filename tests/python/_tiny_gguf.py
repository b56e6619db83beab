"""Small GGUF model files written with the ``gguf`` package (no download): random weights
for a transformers architecture, each linear in a ggml block type, q / k rows
interleaved as llama.cpp's converter stores them for llama. Shared by the whole-model
GGUF tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

# the block types gguf.quants can write, cycled over the linears
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def _metadata(writer, arch: str, *, vocab: int, tie: bool) -> None:
    writer.add_context_length(64)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    if arch == "llama":
        writer.add_rope_dimension_count(16)
    del tie  # tying follows from whether output.weight is written


def _write(path, arch: str, tensors: dict, *, vocab: int, tie: bool) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, arch, vocab=vocab, tie=tie)
    for name, (arr, qtype) in tensors.items():
        if qtype is None:
            writer.add_tensor(name, arr)
        else:
            writer.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_gguf(path, arch: str = "llama", *, tie: bool = True, seed: int = 0) -> list[str]:
    """Write a two-block ``arch`` model to ``path``; returns the block type of each
    quantized linear tensor, in file order. The embedding is ``Q8_0``; the head is
    ``output.weight`` (``Q8_0``) unless ``tie``."""
    from transformers import AutoModelForCausalLM

    from quantrs.torch._gguf_model import gguf_config, llama_row_order, tensor_map

    vocab = 96
    header = path.with_suffix(".header.gguf")
    _write(header, arch, {}, vocab=vocab, tie=tie)
    cfg = gguf_config(header)
    header.unlink()
    cfg.tie_word_embeddings = tie
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    state = model.state_dict()
    names = tensor_map(model, arch)
    rng = np.random.default_rng(seed)
    tensors, kinds = {}, []
    for gguf_name, (hf_name, heads) in names.items():
        if hf_name not in state or (tie and gguf_name == "output.weight"):
            continue
        w = state[hf_name].float().numpy()
        if w.ndim == 1 and hf_name.endswith(".bias"):  # random biases, not zeros
            w = rng.standard_normal(w.shape).astype(np.float32)
        if w.ndim == 2 and heads is not None:  # llama.cpp's interleave: W_file[order] = W_hf
            stored = np.empty_like(w)
            stored[llama_row_order(w.shape[0], heads)] = w
            w = stored
        if w.ndim == 2 and gguf_name.startswith("blk."):
            kind = BLOCK_TYPES[len(kinds) % len(BLOCK_TYPES)]
            kinds.append(kind)
        elif w.ndim == 2:
            kind = "Q8_0"
        else:
            tensors[gguf_name] = (np.ascontiguousarray(w, np.float32), None)
            continue
        qtype = gguf.GGMLQuantizationType[kind]
        tensors[gguf_name] = (gguf.quants.quantize(np.ascontiguousarray(w), qtype), qtype)
    _write(path, arch, tensors, vocab=vocab, tie=tie)
    return kinds
