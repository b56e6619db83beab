"""``quantrs quantize --calibration TEXT``: run the model of a Hugging Face folder on
calibration text before quantizing (docs/checkpoints.md, docs/int4.md).

The folder's tokenizer cuts the text into ``windows`` windows of ``length`` tokens (from
the start); the float model (transformers, float32) runs them, and for every tensor the
selection quantizes:

- ``--method search``: its layer's mean input ``x^2`` (llama.cpp's importance matrix,
  :func:`quantrs.torch.collect_importance`) weighs the scale search;
- ``--method gptq``: :func:`quantrs.torch.quantize_` runs GPTQ layer by layer, and the
  packed weights it makes are written as they are;
- the ggml types (``--format q4_k`` ...): the importance weighs llama.cpp's quantizer, as
  its ``--imatrix`` does (``q8_0`` ignores it, as ggml does).

Everything else streams as without calibration. Needs PyTorch and transformers. A GGUF IN
(:func:`prepare_gguf`) gets the importance for the ggml types the same way, from the float
model and tokenizer transformers builds from the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..formats import Checkpoint
from ._errors import CliError
from ._prepared import Prepared
from ._select import Selector


def chosen_weights(ck: Checkpoint, selector: Selector) -> set[str]:
    """The tensor names ``selector`` quantizes."""
    return {n for n in ck.names() if selector.choose(ck.info(n))[0]}


def _batches(folder: Path, text_path: Path, windows: int, length: int, **tok_args) -> list:
    """The calibration windows: ``text_path`` tokenized by the tokenizer of ``folder``
    (``tok_args``: ``gguf_file=`` for a GGUF file's vocabulary)."""
    from transformers import AutoTokenizer

    try:
        text = text_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"--calibration {str(text_path)!r}: cannot read it as text: {e}") from None
    try:
        tok = AutoTokenizer.from_pretrained(folder, **tok_args)
    except (OSError, ValueError, KeyError) as e:
        where = folder / tok_args["gguf_file"] if tok_args else folder
        raise CliError(f"{where}: no usable tokenizer for --calibration: {e}") from None
    ids = tok(text, return_tensors="pt").input_ids[0]
    n = min(windows, ids.numel() // length)
    if n < 1:
        raise CliError(
            f"--calibration {str(text_path)!r}: {ids.numel()} tokens, fewer than one window "
            f"of {length} (--calibration-length)"
        )
    return [ids[i * length : (i + 1) * length][None] for i in range(n)]


def prepare(
    folder: str,
    text_path: str,
    fmt: str,
    group_size: int,
    method: str,
    selector: Selector,
    windows: int = 8,
    length: int = 512,
) -> Prepared:
    """Importance (``search``, ``ggml``) or GPTQ's packed weights (``gptq``) per chosen
    tensor."""
    if method not in ("search", "gptq", "ggml") or fmt == "fp8":
        raise CliError(
            f"--calibration applies to --method search or gptq of int4 / int4_asym / int4_k "
            f"and to the ggml types, not --format {fmt} --method {method}"
        )
    src = Path(folder)
    if not src.is_dir():
        raise CliError("--calibration needs IN to be a model folder (config.json, tokenizer)")
    try:
        import torch
        from transformers import AutoModelForCausalLM

        from ..torch import collect_importance, quantize_
    except ImportError as e:
        raise CliError(f"--calibration needs PyTorch and transformers ({e})") from None
    with Checkpoint(src) as ck:
        chosen = chosen_weights(ck, selector)
    batches = _batches(src, Path(text_path), windows, length)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()

    def pick(module, fqn: str) -> bool:
        return isinstance(module, torch.nn.Linear) and f"{fqn}.weight" in chosen

    if method in ("search", "ggml"):
        imp = collect_importance(model, batches, pick)
        return Prepared(importance={f"{k}.weight": v for k, v in imp.items()})
    fqns = [n for n, m in model.named_modules() if pick(m, n)]
    quantize_(model, fmt, group_size, pick, quantizer="gptq", calibration=batches)
    packed = {}
    for fqn in fqns:
        m = model.get_submodule(fqn)
        packed[f"{fqn}.weight"] = _packed_of(m)
    return Prepared(packed=packed)


def _packed_of(m):
    """The quantrs weight a quantized layer holds, in the format the file is written in:
    ``GgufLinear`` keeps ``int4_asym`` of group 32 as the identical ``Q4_1`` blocks."""
    from .. import GgufWeight
    from ..formats.gguf import q4_1_blocks_to_asym
    from ..torch import Int4Linear

    if isinstance(m, Int4Linear):
        return m.quantized_weight()
    w = m.weight_packed
    if isinstance(w, GgufWeight) and w.type == "q4_1":
        return q4_1_blocks_to_asym(np.frombuffer(w.to_bytes(), np.uint8), *w.shape)
    return w


def prepare_gguf(
    path: str,
    text_path: str,
    fmt: str,
    method: str | None,
    selector: Selector,
    windows: int = 8,
    length: int = 512,
) -> Prepared:
    """The importance of each tensor ``selector`` chooses in the GGUF file ``path`` (by
    its GGUF name): transformers builds the float32 model from the file (dequantized) and
    its tokenizer from the file's vocabulary; each chosen layer's mean input ``x^2`` is
    keyed by the GGUF name transformers' tensor-name mapping gives it (llama.cpp's row
    interleave of q / k permutes outputs, not the inputs the importance is over)."""
    from ..formats import GgufFile
    from ._quantize_gguf import check_gguf_options

    check_gguf_options(fmt, 32, method)
    try:
        import torch
        from transformers import AutoModelForCausalLM

        from ..torch import collect_importance
        from ..torch._gguf_model import gguf_architecture, tensor_map
    except ImportError as e:
        raise CliError(f"--calibration needs PyTorch, transformers and gguf ({e})") from None
    src = Path(path)
    with GgufFile(src) as g:
        arch = gguf_architecture(g)
        chosen = {n for n, t in g.tensors.items() if selector.choose_gguf(n, len(t.dims))[0]}
    batches = _batches(src.parent, Path(text_path), windows, length, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(
        src.parent, gguf_file=src.name, dtype=torch.float32
    ).eval()
    to_gguf = {
        hf[: -len(".weight")]: name
        for name, (hf, _) in tensor_map(model, arch).items()
        if name in chosen and hf.endswith(".weight")
    }
    imp = collect_importance(model, batches, lambda m, fqn: fqn in to_gguf)
    return Prepared(importance={to_gguf[fqn]: v for fqn, v in imp.items()})
