"""Cross-language vectors: ``tests/data/qat_vectors.json`` is produced by the
NumPy reference (``python tests/python/test_qat_vectors.py`` rewrites it) and
checked by ``tests/qat_vectors.rs`` too, so Rust and the oracle cannot drift.
Floats are stored as their IEEE-754 bit patterns (uint64) to stay exact."""

from __future__ import annotations

import json
import pathlib

import numpy as np

from quantrs.reference import qat as ref

PATH = pathlib.Path(__file__).resolve().parents[1] / "data" / "qat_vectors.json"


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64).tolist()


def _values(bits):
    return np.array(bits, dtype=np.uint64).view(np.float64)


def build():
    rng = np.random.default_rng(2026)
    x = np.concatenate(
        [
            rng.standard_normal(40) * 3,
            [0.0, -0.0, 5e-324, -2.2e-308, 1e-300, 0.5, -0.5, 1.5, 2.5, 12.7],
        ]
    )
    cases = {"int": [], "fp8": [], "adamw": []}
    for target in ["int8", "int4"]:
        for scheme in ["symmetric", "affine"]:
            scale, zp, qmin, qmax = ref.calibrate(x, target, scheme)
            cases["int"].append(
                {
                    "target": target,
                    "scheme": scheme,
                    "x": _bits(x),
                    "scale": _bits([scale])[0],
                    "zero_point": zp,
                    "qmin": qmin,
                    "qmax": qmax,
                    "fake": _bits(ref.fake_quant_int(x, scale, zp, qmin, qmax)),
                }
            )
    y = np.concatenate([x * 50, [1.0625 + 1e-12, 1.0625, 464.0, 465.0, 61439.0, 61440.0, 1e6]])
    for target in ["fp8_e4m3", "fp8_e5m2"]:
        cases["fp8"].append(
            {"target": target, "x": _bits(y), "fake": _bits(ref.fp8_round(y, target))}
        )
    hyper = dict(lr=2e-2, beta1=0.85, beta2=0.995, eps=1e-8, weight_decay=0.05)
    w = rng.standard_normal(33)
    m = rng.standard_normal(33) * 0.1
    v = rng.random(33) * 0.01
    g = rng.standard_normal(33)
    nw, nm, nv, wq = ref.qat_step(w, g, m, v, 7, "int8", "symmetric", **hyper)
    cases["adamw"].append(
        {
            "hyper": {k: _bits([val])[0] for k, val in hyper.items()},
            "t": 7,
            "w": _bits(w),
            "g": _bits(g),
            "m": _bits(m),
            "v": _bits(v),
            "new_w": _bits(nw),
            "new_m": _bits(nm),
            "new_v": _bits(nv),
            "quantized_int8": _bits(wq),
        }
    )
    return cases


def test_vectors_file_is_what_the_reference_produces():
    assert json.loads(PATH.read_text()) == build()


def test_vectors_decode():
    case = json.loads(PATH.read_text())["int"][0]
    assert _values([case["scale"]])[0] > 0
    assert np.isfinite(_values(case["fake"])).all()


if __name__ == "__main__":
    PATH.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {PATH}")
