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

Everything else streams as without calibration. Needs PyTorch and transformers.
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


def _batches(folder: Path, text_path: Path, windows: int, length: int) -> list:
    from transformers import AutoTokenizer

    try:
        text = text_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"--calibration {str(text_path)!r}: cannot read it as text: {e}") from None
    try:
        tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as e:
        raise CliError(f"{folder}: no usable tokenizer for --calibration: {e}") from None
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
