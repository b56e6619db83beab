"""``GgufLinear`` over a Rust weight (``Int4AsymWeight`` of a group other than 32,
``Int4KWeight``, ``IntZpWeight``): ``state_dict`` carries the packed parts,
``load_state_dict`` restores them exactly, and pickle / deepcopy keep the weight."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import quantrs  # noqa: E402
from quantrs.torch import GgufLinear  # noqa: E402

OUT, IN = 24, 512


def _w(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((OUT, IN)).astype(np.float32)


def _zp_with_perm(seed: int) -> quantrs.IntZpWeight:
    base = quantrs.IntZpWeight.quantize(_w(seed), group_size=128, bits=4)
    perm = np.random.default_rng(seed).permutation(IN)
    return quantrs.IntZpWeight.from_parts(
        base.codes(),
        base.scales().astype(np.float16),
        base.zeros(),
        group_size=128,
        bits=4,
        perm=perm,
    )


MAKERS = {
    "int4_asym_g64": lambda s: quantrs.Int4AsymWeight.quantize(_w(s), group_size=64),
    "int4_k": lambda s: quantrs.Int4KWeight.quantize(_w(s)),
    "int_zp4": lambda s: quantrs.IntZpWeight.quantize(_w(s), group_size=128, bits=4),
    "int_zp8": lambda s: quantrs.IntZpWeight.quantize(_w(s), group_size=64, bits=8),
    "int_zp4_perm": _zp_with_perm,
}
PARTS = {
    "int4_asym_g64": {"codes", "scales"},
    "int4_k": {"codes", "scale_codes", "supers"},
    "int_zp4": {"codes", "scales", "zeros"},
    "int_zp8": {"codes", "scales", "zeros"},
    "int_zp4_perm": {"codes", "scales", "zeros", "perm"},
}


def _model(kind: str, seed: int) -> torch.nn.Sequential:
    bias = torch.from_numpy(np.random.default_rng(seed + 100).standard_normal(OUT, np.float32))
    return torch.nn.Sequential(GgufLinear(MAKERS[kind](seed), bias))


X = torch.from_numpy(np.random.default_rng(7).standard_normal((3, IN), np.float32))


@pytest.mark.parametrize("kind", list(MAKERS))
def test_state_dict_round_trip_is_bit_identical(kind):
    src, dst = _model(kind, 1), _model(kind, 2)
    sd = src.state_dict()
    assert {k.split(".", 1)[1] for k in sd} == PARTS[kind] | {"bias"}
    # The export is the packed weight (its own size), not a float copy.
    # (perm: int64 here, as in the safetensors layout; the Rust object keeps it smaller)
    exported = sum(t.numel() * t.element_size() for k, t in sd.items() if k[2:] in PARTS[kind])
    exported -= sd["0.perm"].numel() * 8 if "0.perm" in sd else 0
    assert exported <= 1.1 * src[0].weight_packed.nbytes
    assert not torch.equal(src(X), dst(X))
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    dst.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(dst(X), src(X))
    np.testing.assert_array_equal(dst[0].dequantize().numpy(), src[0].dequantize().numpy())
    for k, t in dst.state_dict().items():
        assert torch.equal(t, sd[k]), k


@pytest.mark.parametrize("kind", list(MAKERS))
def test_pickle_and_deepcopy_keep_the_outputs(kind):
    m = _model(kind, 3)
    want = m(X)
    for other in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert torch.equal(other(X), want)
        assert other[0]._key != m[0]._key  # its own entry of the op's table
        np.testing.assert_array_equal(other[0].dequantize().numpy(), m[0].dequantize().numpy())
    del m
    assert torch.equal(other(X), want)


@pytest.mark.parametrize("kind", ["int4_asym_g64", "int4_k", "int_zp4"])
def test_corrupt_entries_raise_naming_the_key_and_change_nothing(kind):
    m = _model(kind, 4)
    want = m(X)
    good = m.state_dict()
    bad_shape = dict(good, **{"0.codes": good["0.codes"][:, :-1]})
    with pytest.raises(quantrs.DimensionMismatch, match=r"0\.codes"):
        m.load_state_dict(bad_shape)
    bad_dtype = dict(good, **{"0.scales" if kind != "int4_k" else "0.supers": torch.zeros(1)})
    with pytest.raises(quantrs.DimensionMismatch, match=r"0\.(scales|supers)"):
        m.load_state_dict(bad_dtype)
    if kind == "int4_k":  # (D, Dmin) must be finite
        sup = good["0.supers"].clone()
        sup[0, 0, 0] = float("inf")
        with pytest.raises(quantrs.QuantError, match=r"0\.supers"):
            m.load_state_dict(dict(good, **{"0.supers": sup}))
    missing = {k: v for k, v in good.items() if k != "0.codes"}
    with pytest.raises(RuntimeError, match=r"Missing key.*0\.codes"):
        m.load_state_dict(missing)
    assert torch.equal(m(X), want)
    extra = dict(good, **{"0.nonsense": torch.zeros(1)})
    with pytest.raises(RuntimeError, match=r"Unexpected key.*0\.nonsense"):
        m.load_state_dict(extra)
