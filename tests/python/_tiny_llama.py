"""A two-block transformers ``LlamaForCausalLM`` built from a config (no download), shared
by the PyTorch tests that quantize a whole model."""

from __future__ import annotations

import pytest
import torch


def tiny_llama(seed: int = 0, tie: bool = True):
    """The model in eval mode, its weights drawn after ``torch.manual_seed(seed)``;
    ``tie``: the head shares the embedding's weight."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()
