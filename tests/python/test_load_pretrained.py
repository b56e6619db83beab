"""``quantrs.torch.load_pretrained``: a whole transformers Llama from a GPTQ / AWQ /
compressed-tensors FP8 / quantrs INT4 folder in one call. Each checkpoint is written
from the published packing rules (``_zp_packing``; torch's own float8 dtype for FP8;
``quantrs quantize`` for quantrs' layout), and the loaded model's logits are compared
with the float model holding the exactly dequantized weights (computed here, not by
quantrs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_llama import tiny_llama  # noqa: E402
from _zp_packing import (  # noqa: E402
    AWQ_ORDER,
    desc_act_g_idx,
    every_code,
    pack_along_cols,
    pack_along_rows,
    reference,
    zeros_with_edges,
)
from safetensors.numpy import save_file  # noqa: E402

import quantrs  # noqa: E402
from quantrs.formats import FormatError, UnsupportedFormatError  # noqa: E402
from quantrs.torch import FP8Linear, GgufLinear, Int4Linear, load_pretrained  # noqa: E402

GS = 32


def _linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _write(folder, model, qcfg, packed: dict, skip: set):
    """``config.json`` (with ``quantization_config``) and one shard: the model's own
    tensors except the packed layers' weights (``skip``), plus ``packed``."""
    folder.mkdir()
    cfg = model.config.to_dict()
    if qcfg is not None:
        cfg["quantization_config"] = qcfg
    (folder / "config.json").write_text(json.dumps(cfg))
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items() if k not in skip}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file({**sd, **packed}, str(folder / "model.safetensors"))
    return folder


def _gptq(q, zeros, scales, g_idx, v1):
    stored = zeros - 1 if v1 else zeros
    return {
        "qweight": pack_along_rows(q, 4),
        "qzeros": pack_along_cols(stored, 4),
        "scales": scales,
        "g_idx": g_idx.astype(np.int32),
    }


def _awq(q, zeros, scales, g_idx, v1):
    return {
        "qweight": pack_along_cols(q, 4, AWQ_ORDER),
        "qzeros": pack_along_cols(zeros, 4, AWQ_ORDER),
        "scales": scales,
    }


def _zero_point_folder(tmp_path, model, method, act=False, v1=True):
    """Every block linear packed GPTQ / AWQ style; the float model gets the reference
    dequantized weights. Returns the folder."""
    rng = np.random.default_rng(7)
    packed, skip = {}, set()
    for name, lin in _linears(model).items():
        if not name.startswith("model.layers."):
            continue
        out_f, in_f = lin.weight.shape
        groups = in_f // GS
        q = every_code((in_f, out_f), 4, rng)
        zeros = zeros_with_edges((groups, out_f), 4, rng)
        scales = (rng.standard_normal((groups, out_f)) * 0.01).astype(np.float16)
        g_idx = desc_act_g_idx(in_f, GS, rng) if act else np.arange(in_f) // GS
        w = reference(q, scales, zeros, g_idx)  # [in, out], the producers' formula
        lin.weight.data = torch.from_numpy(np.ascontiguousarray(w.T))
        pack = _gptq if method == "gptq" else _awq
        packed.update({f"{name}.{k}": v for k, v in pack(q, zeros, scales, g_idx, v1).items()})
        skip.add(f"{name}.weight")
    qcfg = {"quant_method": method, "bits": 4, "group_size": GS}
    if method == "gptq":
        qcfg.update(desc_act=act, checkpoint_format="gptq" if v1 else "gptq_v2")
    else:
        qcfg.update(version="gemm", zero_point=True)
    return _write(tmp_path / method, model, qcfg, packed, skip)


def _assert_same_logits(loaded, ref):
    ids = torch.randint(
        0, ref.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        want = ref(ids).logits.double()
        got = loaded(ids).logits.double()
    # Different summation orders only: float32 rounding through two blocks.
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.kernel
@pytest.mark.parametrize(
    "method,act,v1", [("gptq", False, True), ("gptq", True, False), ("awq", False, True)]
)
def test_zero_point_folder_loads_whole_model(tmp_path, method, act, v1):
    model = tiny_llama(seed=1, tie=False)
    folder = _zero_point_folder(tmp_path, model, method, act, v1)
    loaded = load_pretrained(folder)
    mods = _linears(loaded)
    block = [m for n, m in loaded.named_modules() if n.startswith("model.layers.")]
    packed = [m for m in block if isinstance(m, GgufLinear)]
    assert len(packed) == 14 and not any(isinstance(m, torch.nn.Linear) for m in block)
    assert all(isinstance(m.weight_packed, quantrs.IntZpWeight) for m in packed)
    assert isinstance(mods["lm_head"], torch.nn.Linear)  # stayed float, read from the file
    torch.testing.assert_close(mods["lm_head"].weight, model.lm_head.weight, rtol=0, atol=0)
    for n, m in loaded.named_modules():
        if isinstance(m, GgufLinear):  # bit for bit the producers' formula
            want = dict(model.named_modules())[n].weight
            assert torch.equal(m.dequantize().view(torch.int32), want.view(torch.int32))
    _assert_same_logits(loaded, model)


@pytest.mark.kernel
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_producer_config_file_without_quant_method(tmp_path, method):
    """AutoGPTQ's quantize_config.json / AutoAWQ's quant_config.json, no quant_method."""
    model = tiny_llama(seed=8, tie=False)
    folder = _zero_point_folder(tmp_path, model, method)
    cfg = json.loads((folder / "config.json").read_text())
    q = cfg.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(cfg))
    if method == "gptq":
        own = {"bits": 4, "group_size": GS, "desc_act": False, "sym": False}
        (folder / "quantize_config.json").write_text(json.dumps(own))
    else:
        own = {"w_bit": 4, "q_group_size": GS, "zero_point": True, "version": q["version"]}
        (folder / "quant_config.json").write_text(json.dumps(own))
    _assert_same_logits(load_pretrained(folder), model)


@pytest.mark.kernel
def test_fp8_compressed_tensors_folder(tmp_path):
    model = tiny_llama(seed=2, tie=True)
    rng = np.random.default_rng(5)
    packed, skip = {}, set()
    for name, lin in _linears(model).items():
        if not name.startswith("model.layers."):
            continue
        codes = rng.integers(0, 256, lin.weight.shape, dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x38  # no NaN codes (E4M3 has no inf)
        scale = np.float32(rng.uniform(0.001, 0.01))
        f8 = torch.from_numpy(codes).view(torch.float8_e4m3fn)
        lin.weight.data = f8.float() * torch.tensor(scale)
        packed[f"{name}.weight"] = codes  # written as U8, retagged below
        packed[f"{name}.weight_scale"] = np.array([scale], np.float32)
        skip.add(f"{name}.weight")
    folder = _write(tmp_path / "fp8", model, {"quant_method": "compressed-tensors"}, packed, skip)
    _retag_u8_as_f8(folder / "model.safetensors", [n for n in packed if n.endswith(".weight")])
    loaded = load_pretrained(folder)
    fp8 = [m for m in loaded.modules() if isinstance(m, FP8Linear)]
    assert len(fp8) == 14
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # tied, as transformers
    _assert_same_logits(loaded, model)


def _retag_u8_as_f8(path, names):
    """safetensors.numpy cannot write F8_E4M3: the bytes are the same, so the header's
    dtype is rewritten in place (same length: 'U8' -> 'F8_E4M3' padded by the header's
    trailing spaces is not possible, so the header is rebuilt)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    for name in names:
        header[name]["dtype"] = "F8_E4M3"
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-len(new) % 8)
    path.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n :])


@pytest.mark.kernel
def test_quantrs_int4_folder_from_quantize(tmp_path):
    from quantrs.cli import main

    model = tiny_llama(seed=3, tie=True)
    src = tmp_path / "float"
    model.save_pretrained(src)
    out = tmp_path / "int4"
    assert main(["quantize", str(src), str(out), "--format", "int4", "--no-progress"]) == 0
    loaded = load_pretrained(out)
    int4 = {n: m for n, m in loaded.named_modules() if isinstance(m, Int4Linear)}
    assert len(int4) == 14
    # The reference: the written nibbles and scales decoded here, into the float model.
    from safetensors.numpy import load_file

    t = load_file(str(out / "model.safetensors"))
    mods = dict(model.named_modules())
    for n in int4:
        data, scales = t[f"{n}.weight.qweight"], t[f"{n}.weight.scales"]
        q = np.empty((2 * data.shape[0], data.shape[1]), np.int8)
        q[0::2] = (data << 4).view(np.int8) >> 4
        q[1::2] = data.view(np.int8) >> 4
        w = q.astype(np.float32) * np.repeat(scales, GS, axis=0)[: q.shape[0]]
        in_f = mods[n].in_features
        mods[n].weight.data = torch.from_numpy(np.ascontiguousarray(w[:in_f].T))
    _assert_same_logits(loaded, model)


def test_float_folder_loads_as_transformers_does(tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny_llama(seed=4, tie=False)
    model.save_pretrained(tmp_path / "f")
    loaded = load_pretrained(tmp_path / "f")
    want = AutoModelForCausalLM.from_pretrained(tmp_path / "f").eval()
    _assert_same_logits(loaded, want)


def test_bad_folders_raise_naming_the_problem(tmp_path):
    model = tiny_llama(seed=5, tie=False)
    folder = _zero_point_folder(tmp_path, model, "gptq")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "bitsandbytes"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedFormatError, match="quant_method 'bitsandbytes'"):
        load_pretrained(folder)
    cfg["quantization_config"]["quant_method"] = "gptq"
    cfg["hidden_size"] = 96  # the packed layers no longer fit the config
    cfg["head_dim"] = 24
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="model.layers.0"):
        load_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(FormatError, match="config.json"):
        load_pretrained(folder)
    with pytest.raises(FileNotFoundError):
        load_pretrained(tmp_path / "missing")
    with pytest.raises(FormatError, match="model folder"):
        load_pretrained(folder / "model.safetensors")


def test_gguf_of_another_architecture_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedFormatError, match="architecture 'gpt2'"):
        load_pretrained(path)
