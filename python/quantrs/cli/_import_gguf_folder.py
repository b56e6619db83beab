"""``quantrs convert FILE.gguf FOLDER --from gguf``: a GGUF model as a Hugging Face model
folder that :func:`quantrs.torch.load_pretrained` (and any reader of quantrs' layout)
loads, with the file's exact bits.

The tensors are those of the single-file conversion (:mod:`._import`: ``Q4_0`` as INT4
g32, ``Q4_1`` as ``int4_asym`` g32, other block types as their ggml blocks, float tensors
copied), renamed to the PyTorch names of transformers' GGUF mapping
(:mod:`quantrs.torch._gguf_model`), with llama's q / k rows (and biases) put back in
transformers' order; a tensor the model has no place for (``rope_freqs``, the head of a
tied model) is left out and listed in the report. FOLDER gets ``model.safetensors``,
``config.json`` (transformers' config from the file's metadata, with a
``quantization_config`` of ``quant_method`` ``"quantrs"``) and, when the file has a
vocabulary, the tokenizer. Written to a temporary sibling folder renamed at the end.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np

from ..formats import FormatError, GgufFile
from ._errors import CliError
from ._folder import _install, staging_folder
from ._import import _Job, _plan_gguf, _write


def _renamed(job: _Job, hf_name: str, heads: int | None) -> _Job:
    """``job`` writing under ``hf_name``, rows in transformers' order when ``heads``."""
    from ..torch._gguf_model import row_order

    outs = [dataclasses.replace(o, name=hf_name + o.name[len(job.name) :]) for o in job.outs]
    order = row_order(job.shape[0], heads) if heads is not None else None
    # the output axis of each written array: INT4 stores [in pairs, out], the rest [out, ...]
    axis = 1 if job.kind == "int4" else 0
    run = job.run

    def reordered():
        arrays, err, note = run()
        if order is not None:
            arrays = [np.ascontiguousarray(np.take(a, order, axis=axis)) for a in arrays]
        return arrays, err, note

    return _Job(hf_name, job.dtype, job.shape, job.kind, outs, job.bytes_in, reordered, job.meta)


def _model_names(src: Path):
    """transformers' config for the file, and GGUF name -> (PyTorch name, heads)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..torch._gguf_model import gguf_architecture, gguf_config, tensor_map

    with GgufFile(src) as g:
        arch = gguf_architecture(g)
    cfg = gguf_config(src)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return cfg, tensor_map(model, arch)


def _tokenizer(src: Path, out: Path, has_vocab: bool) -> str:
    if not has_vocab:
        return "not written (the file has no tokenizer.ggml.model)"
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    except (ValueError, KeyError, OSError) as e:  # a vocabulary transformers cannot build
        return f"not written ({e})"
    return "written"


def convert_gguf_folder(src, dst, requantize: bool = False, progress: bool = True):
    """Convert GGUF file ``src`` into model folder ``dst``; ``(rows, summary)``."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and not dst.is_dir():
        raise CliError(f"OUT {str(dst)!r} is a file (a .safetensors OUT gets one file)")
    if not dst.parent.is_dir():
        raise CliError(f"output directory {str(dst.parent)!r} does not exist")
    try:
        cfg, names = _model_names(src)
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        with GgufFile(src) as g:
            has_vocab = "tokenizer.ggml.model" in g.metadata
            jobs, skipped = [], []
            for j in _plan_gguf(g, requantize):
                hf_name, heads = names.get(j.name, (None, None))
                if hf_name is None or (tied and hf_name == "lm_head.weight"):
                    skipped.append(j.name)
                    continue
                jobs.append(_renamed(j, hf_name, heads))
            tmp = staging_folder(dst)
            try:
                rows = _write(jobs, tmp / "model.safetensors", "gguf", progress)
                cfg.save_pretrained(tmp)
                config = json.loads((tmp / "config.json").read_text())
                config["quantization_config"] = {
                    "quant_method": "quantrs",
                    "format": "packed",
                    "layout": "quantrs.packed",
                    "layout_version": 1,
                    "source": "gguf",
                    "producer": "quantrs",
                }
                (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
                tokenizer = _tokenizer(src, tmp, has_vocab)
                _install(tmp, dst)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except FormatError as e:
        raise CliError(str(e)) from None
    summary = {
        "input": str(src),
        "output": str(dst),
        "architecture": cfg.model_type,
        "left_out": skipped,
        "tokenizer": tokenizer,
    }
    return rows, summary
