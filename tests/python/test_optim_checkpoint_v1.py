"""A checkpoint written by state format 1 (tests/data/make_adamw4bit_v1.py, run with the
format-1 extension) still loads, decodes to the same moments, and continues training."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from quantrs.reference import decode_moments

DATA = Path(__file__).parents[1] / "data"


def fixture_module():
    spec = importlib.util.spec_from_file_location("make_v1", DATA / "make_adamw4bit_v1.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_format_1_checkpoint_loads_and_continues():
    mk = fixture_module()
    saved = load_file(str(DATA / "adamw4bit_v1.safetensors"))
    assert json.loads(bytes(saved["meta"]).decode())["version"] == 1
    expect = load_file(str(DATA / "adamw4bit_v1_params.safetensors"))
    opt = mk.make()
    opt.load_state(DATA / "adamw4bit_v1.safetensors")
    assert opt.state().step == mk.STEPS
    sd = opt.state_dict()
    assert json.loads(bytes(sd["meta"]).decode())["version"] == 2
    for key in ("n:W", "n:b"):
        for a, b in zip(decode_moments(sd, key), decode_moments(saved, key)):
            np.testing.assert_array_equal(a, b)
    params = {k: expect[k].copy() for k in mk.SHAPES}
    mk.train(opt, params, mk.STEPS, mk.STEPS + mk.MORE)
    for k in mk.SHAPES:
        moved = np.abs(expect[f"{k}@more"] - expect[k])
        diff = np.abs(params[k] - expect[f"{k}@more"])
        assert moved.mean() > 1e-3
        # Format 2 rounds v's block scales differently, so the path differs slightly from
        # the format-1 code's: a small fraction of how far the weights moved (restarting
        # from a fresh state instead of the checkpoint would differ by about all of it).
        assert diff.mean() <= 0.05 * moved.mean(), (diff.mean(), moved.mean())
        assert diff.max() <= 0.2 * moved.max(), (diff.max(), moved.max())
