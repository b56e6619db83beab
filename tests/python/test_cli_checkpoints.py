"""`quantrs quantize` on model folders, `quantrs convert`, `quantrs inspect` dialects."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from _helpers import peak_rss
from safetensors import safe_open
from safetensors.numpy import save_file

import quantrs
from quantrs.cli import load_int4, main
from quantrs.formats import load_fp8

gguf = pytest.importorskip("gguf")

HIDDEN, FF, VOCAB = 64, 96, 50


def model_folder(path, seed=0, hidden=HIDDEN, ff=FF, vocab=VOCAB):
    """A 2-layer Llama-like model in 3 shards: tied embedding (no lm_head), norms,
    biases on q/k/v, tokenizer and generation files, an index."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    shards = [{"model.embed_tokens.weight": w(vocab, hidden)}, {}, {}]
    for i in range(2):
        p = f"model.layers.{i}."
        s = shards[1 + i]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            s[p + f"self_attn.{proj}.weight"] = w(hidden, hidden)
        for proj in ("q_proj", "k_proj", "v_proj"):
            s[p + f"self_attn.{proj}.bias"] = w(hidden)
        s[p + "mlp.gate_proj.weight"] = w(ff, hidden)
        s[p + "mlp.up_proj.weight"] = w(ff, hidden)
        s[p + "mlp.down_proj.weight"] = w(hidden, ff).astype(np.float16)
        s[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        s[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    shards[2]["model.norm.weight"] = np.ones(hidden, np.float32)
    path.mkdir()
    names = [f"model-0000{i + 1}-of-00003.safetensors" for i in range(3)]
    wmap = {}
    for name, s in zip(names, shards):
        save_file(s, str(path / name), metadata={"format": "pt"})
        wmap.update(dict.fromkeys(s, name))
    index = {"metadata": {"total_size": sum(a.nbytes for s in shards for a in s.values())}}
    index["weight_map"] = wmap
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
              "tie_word_embeddings": True, "torch_dtype": "float32"}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text('{"version": "1.0"}')
    (path / "generation_config.json").write_text('{"do_sample": false}')
    tensors = {k: v for s in shards for k, v in s.items()}
    return path, tensors


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def is_linear(name: str) -> bool:
    return name.endswith(".weight") and any(p in name for p in LINEAR)


def check_folder(out, src, tensors):
    index = json.loads((out / "model.safetensors.index.json").read_text())
    wmap = index["weight_map"]
    sizes = 0
    for shard in sorted(set(wmap.values())):
        with safe_open(str(out / shard), "numpy") as f:
            keys = set(f.keys())
        assert keys == {k for k, v in wmap.items() if v == shard}, shard
    for shard in set(wmap.values()):
        from quantrs.formats._stfile import StReader

        with StReader(out / shard) as r:
            sizes += sum(t.nbytes for t in r.tensors)
    assert index["metadata"]["total_size"] == sizes
    for name in ("tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    config = json.loads((out / "config.json").read_text())
    orig = json.loads((src / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "quantization_config"} == orig
    # untouched tensors, bit for bit (the safetensors library reads them)
    for name, a in tensors.items():
        if not is_linear(name):
            with safe_open(str(out / wmap[name]), "numpy") as f:
                got = f.get_tensor(name)
            assert got.dtype == a.dtype and np.array_equal(got, a), name
    return config["quantization_config"], wmap


@pytest.mark.skipif(not hasattr(quantrs, "PerTensorFP8Linear"), reason="FP8 not built")
@pytest.mark.parametrize("layout", ["compressed-tensors", "mistralrs"])
def test_fp8_folder(tmp_path, capsys, layout):
    src, tensors = model_folder(tmp_path / "in")
    out = tmp_path / "out"
    argv = ["quantize", str(src), str(out), "--format", "fp8", "--no-progress", "--json"]
    assert main(argv + ["--layout", layout]) == 0
    report = json.loads(capsys.readouterr().out)
    kinds = {r["name"]: r["kind"] for r in report["tensors"]}
    assert kinds == {k: "fp8" if is_linear(k) else "copy" for k in tensors}
    qcfg, wmap = check_folder(out, src, tensors)
    if layout == "compressed-tensors":
        assert qcfg["quant_method"] == "compressed-tensors"
        assert qcfg["format"] == "float-quantized"
        weights = qcfg["config_groups"]["group_0"]["weights"]
        assert weights == {"num_bits": 8, "type": "float", "strategy": "tensor",
                           "symmetric": True, "dynamic": False}  # fmt: skip
        assert qcfg["config_groups"]["group_0"]["input_activations"] is None
        assert sorted(qcfg["ignore"]) == ["lm_head", "model.embed_tokens"]
        assert "model.layers.0.self_attn.q_proj.weight_scale" in wmap
    else:
        assert qcfg["quant_method"] == "fp8" and qcfg["weight_block_size"] is None
        assert "model.layers.0.self_attn.q_proj.weight_scale_inv" in wmap
    # load back layer by layer, both readers, bit for bit against from_float
    for name, w in tensors.items():
        if not is_linear(name):
            continue
        prefix = name.removesuffix(".weight")
        want = quantrs.PerTensorFP8Linear.from_float(
            w.astype(np.float32), tensors.get(prefix + ".bias")
        )
        got = load_fp8(out, prefix)
        rust = quantrs.PerTensorFP8Linear.from_safetensors(out / wmap[name], prefix)
        for layer in (got, rust):
            assert np.array_equal(layer.dequantize_w(), want.dequantize_w()), name
            assert layer.weight_scale_inv == want.weight_scale_inv
        if prefix + ".bias" in tensors:
            assert np.array_equal(got.bias, tensors[prefix + ".bias"])
    assert main(["inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    kinds = {t["name"]: t["kind"] for t in info["tensors"]}
    want_dialect = "compressed-tensors" if layout == "compressed-tensors" else "mistralrs"
    assert kinds["model.layers.1.mlp.up_proj.weight"].endswith(f"({want_dialect})")
    assert len(info["files"]) == 3


def test_int4_folder_and_selection(tmp_path, capsys):
    src, tensors = model_folder(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["quantize", str(src), str(out), "--format", "int4", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "copy (embedding)" in table and "copy (1-D)" in table
    qcfg, wmap = check_folder(out, src, tensors)
    assert qcfg["quant_method"] == "quantrs" and qcfg["format"] == "int4"
    assert qcfg["group_size"] == 32 and "model.embed_tokens" in qcfg["modules_not_converted"]
    for name, w in tensors.items():
        if is_linear(name):
            want = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(w.astype(np.float32).T))
            assert load_int4(out, name) == want, name
    # --include replaces the rule, --exclude removes
    out2 = tmp_path / "out2"
    argv = ["quantize", str(src), str(out2), "--format", "int4", "--no-progress", "--json"]
    argv += ["--include", "*.mlp.*", "--include", "model.embed_tokens.weight"]
    argv += ["--exclude", "*.down_proj.*"]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["tensors"]}
    assert rows["model.embed_tokens.weight"]["kind"] == "int4"
    assert rows["model.layers.0.mlp.up_proj.weight"]["kind"] == "int4"
    assert rows["model.layers.0.mlp.down_proj.weight"]["reason"] == "matched by --exclude"
    assert rows["model.layers.0.self_attn.q_proj.weight"]["reason"] == "not matched by --include"


def test_folder_atomic_and_errors(tmp_path, capsys):
    src, _ = model_folder(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious").write_text("keep")
    bad = tmp_path / "bad"
    model_folder(bad, seed=1)
    shard = bad / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-7])  # truncated
    assert main(["quantize", str(bad), str(out), "--format", "int4", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err
    assert sorted(os.listdir(out)) == ["precious"]
    # an index naming a tensor no shard has / a shard that is missing
    idx = json.loads((src / "model.safetensors.index.json").read_text())
    broken = tmp_path / "broken"
    model_folder(broken)
    for wmap, needle in (
        ({**idx["weight_map"], "ghost.weight": "model-00001-of-00003.safetensors"}, "ghost"),
        ({**idx["weight_map"], "lm_head.weight": "model-00004-of-00003.safetensors"}, "missing"),
    ):
        (broken / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
        assert main(["quantize", str(broken), str(out), "--format", "fp8", "--no-progress"]) == 1
        assert needle in capsys.readouterr().err
        assert sorted(os.listdir(out)) == ["precious"]
    # success replaces OUT; no temporary folders left behind
    assert main(["quantize", str(src), str(out), "--format", "int4", "--no-progress"]) == 0
    assert not (out / "precious").exists() and (out / "config.json").exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    # the installed folder has mkdir's permissions under the umask, not mkdtemp's 0700
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o777 & ~umask
    # an already-quantized folder is refused; OUT inside IN is refused
    assert main(["quantize", str(out), str(tmp_path / "x"), "--format", "fp8"]) == 1
    assert "already quantized" in capsys.readouterr().err
    assert main(["quantize", str(src), str(src / "sub"), "--format", "fp8"]) == 1
    assert "outside IN" in capsys.readouterr().err


# --- convert ------------------------------------------------------------------------------


def _pack_gptq(q, zeros_stored):
    qweight = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for j in range(8):
        qweight |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
    qzeros = np.zeros((zeros_stored.shape[0], q.shape[1] // 8), np.uint32)
    for j in range(8):
        qzeros |= zeros_stored[:, j::8].astype(np.uint32) << np.uint32(4 * j)
    return qweight.view(np.int32), qzeros.view(np.int32)


def test_convert_gptq_folder(tmp_path, capsys):
    rng = np.random.default_rng(5)
    folder = tmp_path / "gptq"
    folder.mkdir()
    shards = [{}, {}]
    want = {}
    for i, s in enumerate(shards):
        q = rng.integers(0, 16, (128, 32), dtype=np.uint8)
        qweight, qzeros = _pack_gptq(q, np.full((4, 32), 7))
        scales = (rng.standard_normal((4, 32)) * 0.01).astype(np.float16)
        p = f"model.layers.{i}.mlp.up_proj"
        s.update({p + ".qweight": qweight, p + ".qzeros": qzeros, p + ".scales": scales,
                  p + ".g_idx": (np.arange(128) // 32).astype(np.int32),
                  p + ".bias": rng.standard_normal(32).astype(np.float16)})  # fmt: skip
        want[p] = scales[np.arange(128) // 32].astype(np.float32) * (q.astype(np.float32) - 8)
    shards[1]["model.norm.weight"] = np.ones(32, np.float32)
    wmap = {}
    for i, s in enumerate(shards):
        save_file(s, str(folder / f"s{i}.safetensors"))
        wmap.update(dict.fromkeys(s, f"s{i}.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    (folder / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}})
    )
    out = tmp_path / "out.safetensors"
    argv = ["convert", str(folder), str(out), "--from", "gptq", "--no-progress", "--json"]
    assert main(argv) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["model.layers.0.mlp.up_proj"]["kind"] == "int4 exact"
    assert rows["model.layers.0.mlp.up_proj"]["rel_err"] == 0.0
    assert rows["model.norm.weight"]["kind"] == "copy"
    for p, w in want.items():
        assert np.array_equal(load_int4(out, p + ".weight").dequantize(), w)
    with safe_open(str(out), "numpy") as f:
        assert np.array_equal(
            f.get_tensor("model.layers.1.mlp.up_proj.bias"),
            shards[1]["model.layers.1.mlp.up_proj.bias"],
        )
        assert not any(k.endswith((".qzeros", ".g_idx")) for k in f.keys())
    assert main(["inspect", str(out)]) == 0
    assert "int4 of model.layers.0.mlp.up_proj.weight" in capsys.readouterr().out


def test_convert_awq_file(tmp_path, capsys):
    rng = np.random.default_rng(6)
    q = rng.integers(0, 16, (64, 16), dtype=np.uint8)
    order = [0, 2, 4, 6, 1, 3, 5, 7]

    def pack(a):
        p = np.zeros((a.shape[0], a.shape[1] // 8), np.uint32)
        for c in range(a.shape[1] // 8):
            for j in range(8):
                p[:, c] |= a[:, 8 * c + order[j]].astype(np.uint32) << np.uint32(4 * j)
        return p.view(np.int32)

    scales = (rng.standard_normal((1, 16)) * 0.1).astype(np.float16)
    path = tmp_path / "awq.safetensors"
    save_file({"l.qweight": pack(q), "l.qzeros": pack(np.full((1, 16), 8, np.uint8)),
               "l.scales": scales}, str(path))  # fmt: skip
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), str(out), "--from", "awq", "--no-progress"]) == 0
    assert "int4 exact" in capsys.readouterr().out
    want = scales.astype(np.float32) * (q.astype(np.float32) - 8)
    assert np.array_equal(load_int4(out, "l.weight").dequantize(), want)


def test_convert_gguf(tmp_path, capsys):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    path = tmp_path / "m.gguf"
    gw = gguf.GGUFWriter(str(path), "llama")
    q4 = gguf.GGMLQuantizationType.Q4_0
    gw.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(w, q4), raw_dtype=q4)
    gw.add_tensor("blk.0.attn_norm.weight", norm)
    q8 = gguf.GGMLQuantizationType.Q8_0
    gw.add_tensor("output.weight", gguf.quants.quantize(w, q8), raw_dtype=q8)
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(path), str(out), "--from", "gguf", "--no-progress", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["blk.0.attn_q.weight"]["kind"] == "int4 exact"
    assert rows["output.weight"]["kind"] == "gguf q8_0 exact"  # kept as its blocks
    deq = gguf.quants.dequantize(gguf.quants.quantize(w, q4), q4).reshape(32, 64)
    assert np.array_equal(load_int4(out, "blk.0.attn_q.weight").dequantize(), deq.T)
    with safe_open(str(out), "numpy") as f:
        assert np.array_equal(f.get_tensor("blk.0.attn_norm.weight"), norm)
        assert np.array_equal(f.get_tensor("output.weight.blocks"), gguf.quants.quantize(w, q8))


# --- memory (the done-when run) -------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_folder_peak_memory(tmp_path, fmt):
    """3 shards, 64 MiB float32 linear weights: the peak stays under 2x the largest tensor."""
    src, tensors = model_folder(tmp_path / "in", hidden=4096, ff=4096, vocab=1024)
    largest = max(a.nbytes for a in tensors.values())
    total = sum(a.nbytes for a in tensors.values())
    del tensors
    base = peak_rss()
    out = tmp_path / "out"
    peak = peak_rss("quantize", str(src), str(out), "--format", fmt, "--no-progress")
    assert (out / "config.json").exists()
    assert peak - base < 2 * largest, (peak - base) / largest
    assert peak - base < total


@pytest.mark.skipif(not hasattr(quantrs, "PerTensorFP8Linear"), reason="FP8 not built")
def test_single_file_defaults(tmp_path, capsys):
    """A file IN: linear weights only, FP8 as compressed-tensors (weight_scale F32 [1])."""
    rng = np.random.default_rng(9)
    t = {
        "model.embed_tokens.weight": rng.standard_normal((20, 16)).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((24, 16)).astype(np.float32),
        "model.layers.0.mlp.up_proj.bias": rng.standard_normal(24).astype(np.float32),
        "lm_head.weight": rng.standard_normal((20, 16)).astype(np.float32),
    }
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(t, str(src))
    assert main(["quantize", str(src), str(dst), "--format", "fp8", "--no-progress"]) == 0
    from quantrs.formats._stfile import StReader

    with StReader(dst) as r:
        entries = {x.name: (x.dtype, list(x.shape)) for x in r.tensors}
    assert entries["model.layers.0.mlp.up_proj.weight"] == ("F8_E4M3", [24, 16])
    assert entries["model.layers.0.mlp.up_proj.weight_scale"] == ("F32", [1])
    assert entries["lm_head.weight"] == ("F32", [20, 16])
    assert entries["model.embed_tokens.weight"] == ("F32", [20, 16])
    layer = quantrs.PerTensorFP8Linear.from_safetensors(dst, "model.layers.0.mlp.up_proj")
    want = quantrs.PerTensorFP8Linear.from_float(
        t["model.layers.0.mlp.up_proj.weight"], t["model.layers.0.mlp.up_proj.bias"]
    )
    assert np.array_equal(layer.dequantize_w(), want.dequantize_w())
    assert "copy (output head / embedding)" in capsys.readouterr().out
