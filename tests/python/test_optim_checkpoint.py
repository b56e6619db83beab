"""Lossless, validated, atomic checkpoints of AdamW4bit (docs/optim.md, "State layout")."""

from __future__ import annotations

import json

import numpy as np
import pytest

import quantrs

PARAMS = {"W": (24, 40), "b": (40,), "E": (3, 5, 7)}


def make(**q):
    return quantrs.AdamW4bit.with_quantization_config(
        quantrs.Adam4bitOptimizerConfig(1e-2, 0.9, 0.999, 1e-8, 0.01),
        quantrs.AdvancedQuantizationConfig(**q),
    )


def grads(step):
    rng = np.random.default_rng(100 + step)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in PARAMS.items()}


def train(opt, params, start, stop):
    for s in range(start, stop):
        for k, g in grads(s).items():
            opt.update(params[k], g, name=k)
        opt.step()


def fresh_params():
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in PARAMS.items()}


def snapshot(opt):
    return {k: v.copy() for k, v in opt.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


CONFIGS = [
    {},
    {"method": "int8", "double_quantization": False, "block_size": 32},
    {"rank1_normalization": True, "variance_map": "log", "method": "dynamic"},
]


@pytest.mark.kernel
@pytest.mark.parametrize("q", CONFIGS)
@pytest.mark.parametrize("via", ["state_dict", "file"])
def test_restore_and_continue_is_bit_identical(q, via, tmp_path):
    ref_params = fresh_params()
    ref = make(**q)
    train(ref, ref_params, 0, 10)

    params = fresh_params()
    first = make(**q)
    train(first, params, 0, 4)
    restored = quantrs.AdamW4bit()  # defaults: the checkpoint brings its own config
    if via == "file":
        path = tmp_path / "opt.safetensors"
        first.save_state(path)
        restored.load_state(str(path))
    else:
        restored.load_state_dict(first.state_dict())
    assert restored.config() == first.config()
    assert restored.state().step == 4
    assert same(snapshot(restored), snapshot(first))
    train(restored, params, 4, 10)
    for k in PARAMS:
        assert np.array_equal(params[k], ref_params[k]), k
    assert same(snapshot(restored), snapshot(ref))


def test_state_dict_layout():
    opt = make()
    train(opt, fresh_params(), 0, 2)
    sd = opt.state_dict()
    meta = json.loads(bytes(sd["meta"]).decode())
    assert meta["step"] == 2 and meta["optimizer"] == "AdamW4bit"
    assert meta["params"] == {f"n:{k}": list(s) for k, s in PARAMS.items()}
    assert sd["config"].dtype == np.float32 and sd["config"][0] == np.float32(1e-2)
    assert sd["n:W/m_codes"].dtype == np.uint8
    assert sd["n:W/m_scale_groups"].shape == (1, 2)


def test_file_is_safetensors_and_written_atomically(tmp_path):
    from safetensors.numpy import load_file

    opt = make()
    train(opt, fresh_params(), 0, 1)
    path = tmp_path / "opt.safetensors"
    opt.save_state(path)
    loaded = load_file(str(path))
    assert same(loaded, opt.state_dict())
    assert [p.name for p in tmp_path.iterdir()] == ["opt.safetensors"]  # no temp file left
    with pytest.raises(OSError):
        opt.save_state(tmp_path / "missing-dir" / "x.safetensors")
    with pytest.raises(FileNotFoundError):
        opt.load_state(tmp_path / "nope.safetensors")


def _victim():
    opt = make()
    train(opt, fresh_params(), 0, 3)
    return opt


def test_truncated_or_corrupted_file_raises_and_changes_nothing(tmp_path):
    src = make(block_size=128)
    train(src, fresh_params(), 0, 5)
    good = tmp_path / "good.safetensors"
    src.save_state(good)
    data = good.read_bytes()
    opt = _victim()
    before = snapshot(opt)
    bad = tmp_path / "bad.safetensors"
    variants = [data[:n] for n in (0, 7, len(data) // 2, len(data) - 1)]
    for pos in (len(data) - 1, len(data) - 200, len(data) // 2):
        flipped = bytearray(data)
        flipped[pos] ^= 0x04
        variants.append(bytes(flipped))
    for v in variants:
        bad.write_bytes(v)
        with pytest.raises(quantrs.SerializationError):
            opt.load_state(bad)
        assert same(snapshot(opt), before)
        assert opt.config_dict()["block_size"] == 64


def test_invalid_state_dicts_raise_and_change_nothing():
    src = make()
    train(src, fresh_params(), 0, 2)
    good = src.state_dict()
    opt = _victim()
    before = snapshot(opt)

    def edited(fn):
        d = {k: v.copy() for k, v in good.items()}
        fn(d)
        return d

    def set_meta(d, **kw):
        meta = json.loads(bytes(d["meta"]).decode())
        meta.update(kw)
        d["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8).copy()

    bad_dicts = [
        edited(lambda d: d.pop("n:W/v_codes")),
        edited(lambda d: d.update({"extra": np.zeros(1, np.uint8)})),
        edited(lambda d: d["n:W/m_codes"].__setitem__(0, d["n:W/m_codes"][0] ^ 1)),
        edited(lambda d: d.update({"n:b/m_codes": d["n:b/m_codes"][:-1]})),
        edited(lambda d: d.update({"meta": d["meta"][:-3]})),
        edited(lambda d: set_meta(d, optimizer="Adam4bit")),
        edited(lambda d: set_meta(d, block_size=3)),
        edited(lambda d: set_meta(d, version=99)),
    ]
    for d in bad_dicts:
        with pytest.raises(quantrs.SerializationError):
            opt.load_state_dict(d)
        assert same(snapshot(opt), before)
    with pytest.raises(TypeError):
        opt.load_state_dict(edited(lambda d: d.update({"config": d["config"].astype(np.float64)})))
    assert same(snapshot(opt), before)
    # An AdamW state does not load into Adam.
    with pytest.raises(quantrs.SerializationError, match="AdamW4bit"):
        quantrs.Adam4bit().load_state_dict(good)


def test_reset_state():
    opt = _victim()
    opt.reset_state()
    assert opt.num_parameters() == 0 and opt.state().step == 0
    assert opt.memory_usage().total_bytes == 0 and opt.memory_savings() == 0.0
