"""GPTQ checkpoints loaded exactly (docs/checkpoints.md): 4- and 8-bit, symmetric and
asymmetric, v1 (zero - 1 stored) and v2, trivial and act-order ``g_idx``, one group per
row; against the GPTQ formula computed here in NumPy, bit for bit; the forward against
float64 within the fused kernel's bound; corrupt tensors refused naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _zp_packing import (
    desc_act_g_idx,
    every_code,
    fused_bound,
    matmul_at_level,
    pack_along_cols,
    pack_along_rows,
    reference,
    scales_both_signs,
    write_checkpoint,
    zeros_with_edges,
)
from safetensors.numpy import save_file

import quantrs
from quantrs.formats import Checkpoint, FormatError, RequantizedWarning, load_gptq
from quantrs.formats.gptq import read_gptq
from quantrs.torch import GgufLinear

F32_BITS = np.uint32


def gptq_layer(in_feat, out, gs, *, bits=4, sym=False, act=False, v1=True, seed=0):
    """The tensors of one GPTQ layer and what they mean: codes ``[in, out]``, zero
    points and scales ``[groups, out]``, each input's group."""
    rng = np.random.default_rng(seed)
    g = in_feat if gs == -1 else gs
    groups = -(-in_feat // g)
    q = every_code((in_feat, out), bits, rng)
    zeros = (
        np.full((groups, out), 1 << (bits - 1), np.int64)
        if sym
        else zeros_with_edges((groups, out), bits, rng)
    )
    scales = scales_both_signs((groups, out), rng)
    g_idx = desc_act_g_idx(in_feat, g, rng) if act else (np.arange(in_feat) // g).astype(np.int32)
    stored = zeros - 1 if v1 else zeros  # v1 stores zero - 1 (0 as all ones)
    tensors = {
        "qweight": pack_along_rows(q, bits),
        "qzeros": pack_along_cols(stored, bits),
        "scales": scales,
        "g_idx": g_idx,
        "bias": rng.standard_normal(out).astype(np.float16),
    }
    return tensors, (q, zeros, scales, g_idx)


def save(tmp_path, layers: dict, *, bits=4, gs=128, v1=True, name="m"):
    config = {"quant_method": "gptq", "bits": bits, "group_size": gs, "desc_act": True}
    config["checkpoint_format"] = "gptq" if v1 else "gptq_v2"
    tensors = {f"{p}.{k}": v for p, t in layers.items() for k, v in t.items()}
    return write_checkpoint(tmp_path / name, config, tensors)


CASES = [
    # in, out, group size, bits, symmetric, act-order, v1
    (256, 32, 128, 4, False, False, True),
    (256, 32, 128, 4, False, True, True),
    (256, 32, 128, 4, True, True, False),
    (576, 24, 128, 4, False, True, False),  # 576 = 4 groups of 128 and one of 64
    (256, 16, 32, 4, False, False, False),
    (256, 16, -1, 4, False, False, True),  # one group per row
    (256, 16, 128, 8, False, False, True),
    (256, 16, 128, 8, True, True, True),
    (192, 16, 64, 8, False, True, False),
]


@pytest.mark.kernel
@pytest.mark.parametrize("in_feat,out,gs,bits,sym,act,v1", CASES)
def test_gptq_loads_bit_exact(tmp_path, in_feat, out, gs, bits, sym, act, v1):
    tensors, (q, zeros, scales, g_idx) = gptq_layer(
        in_feat, out, gs, bits=bits, sym=sym, act=act, v1=v1, seed=in_feat + bits
    )
    folder = save(tmp_path, {"l": tensors}, bits=bits, gs=gs, v1=v1)
    want = reference(q, scales, zeros, g_idx)  # [in, out]
    with Checkpoint(folder) as ck:
        imp = read_gptq(ck, "l")
        file_bytes = sum(ck.info(f"l.{k}").nbytes for k in ("qweight", "qzeros", "scales", "g_idx"))
    w = imp.qweight
    assert isinstance(w, quantrs.IntZpWeight)
    assert (w.bits, w.shape) == (bits, (out, in_feat))
    assert (w.perm is not None) == act
    got = w.dequantize()
    assert np.array_equal(got.view(F32_BITS), np.ascontiguousarray(want.T).view(F32_BITS))
    # Packed, about the file's size: codes, halves, zero-point bytes, the permutation.
    assert w.nbytes <= 1.2 * file_bytes
    np.testing.assert_array_equal(w.dequantize_rows(3, 7), got[3:7])
    bias = tensors["bias"].astype(np.float64)
    for rows in (1, 4, 33):
        x = np.random.default_rng(rows).standard_normal((rows, in_feat)).astype(np.float32)
        y = w.matmul(x)
        ref = x.astype(np.float64) @ want.astype(np.float64)
        assert (np.abs(y - ref) <= fused_bound(x, scales, q, zeros, g_idx)).all()
        lin = load_gptq(folder, "l")
        assert lin.format == "int_zp"
        yl = lin.forward(x)
        assert (np.abs(yl - ref - bias) <= fused_bound(x, scales, q, zeros, g_idx, bias)).all()


def test_symmetric_trivial_order_keeps_loading_into_int4(tmp_path):
    tensors, (q, zeros, scales, g_idx) = gptq_layer(256, 16, 128, sym=True)
    folder = save(tmp_path, {"l": tensors})
    lin = load_gptq(folder, "l")
    assert isinstance(lin, quantrs.Int4Linear)
    want = reference(q, scales, zeros, g_idx)
    assert np.array_equal(lin.qweight.dequantize().view(F32_BITS), want.view(F32_BITS))


@pytest.mark.kernel
def test_every_simd_level_equals_scalar_within_rounding(tmp_path):
    tensors, (q, zeros, scales, g_idx) = gptq_layer(576, 40, 128, act=True, seed=5)
    folder = save(tmp_path, {"l": tensors}, v1=True)
    with Checkpoint(folder) as ck:
        w = read_gptq(ck, "l").qweight
    parts = tmp_path / "w.npz"
    np.savez(
        parts, codes=w.codes(), scales=w.scales().astype(np.float16), zeros=w.zeros(),
        gs=128, bits=4, perm=w.perm,
    )  # fmt: skip
    x = np.random.default_rng(1).standard_normal((2, 576)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    scalar = matmul_at_level("scalar", str(parts), str(tmp_path / "x.npy"))
    bound = fused_bound(x, scales, q, zeros, g_idx)
    for level in ("avx2", "avx512"):
        y = matmul_at_level(level, str(parts), str(tmp_path / "x.npy"))
        assert (np.abs(y - scalar) <= 2 * bound).all(), level
    assert (np.abs(w.matmul(x) - scalar) <= 2 * bound).all()


def test_runs_in_pytorch_with_input_gradients(tmp_path):
    tensors, (q, zeros, scales, g_idx) = gptq_layer(256, 24, 64, act=True, seed=9)
    folder = save(tmp_path, {"l": tensors}, gs=64)
    with Checkpoint(folder) as ck:
        imp = read_gptq(ck, "l")
    mod = GgufLinear(imp.qweight, torch.from_numpy(imp.bias))
    want = torch.from_numpy(reference(q, scales, zeros, g_idx).T.copy()).double()
    x = torch.randn(3, 256, dtype=torch.float64, requires_grad=True)
    y = mod(x)
    assert y.dtype == torch.float64
    ref = x.detach() @ want.T + torch.from_numpy(imp.bias).double()
    torch.testing.assert_close(y.detach(), ref, rtol=1e-4, atol=1e-3)
    y.sum().backward()
    torch.testing.assert_close(x.grad, want.sum(0).expand(3, -1), rtol=1e-5, atol=1e-4)
    assert torch.equal(mod.dequantize(), want.float())


def test_not_representable_is_refused_or_requantized(tmp_path):
    # 48 inputs in groups of 16: neither INT4 (asymmetric) nor int_zp (runs of 32).
    tensors, (q, zeros, scales, g_idx) = gptq_layer(48, 16, 16, seed=2)
    folder = save(tmp_path, {"l": tensors}, gs=16)
    with pytest.raises(FormatError, match=r"'l'.*asymmetric zero points.*int_zp: 48 inputs"):
        load_gptq(folder, "l")
    with pytest.warns(RequantizedWarning, match="relative error"):
        lin = load_gptq(folder, "l", requantize=True)
    want = reference(q, scales, zeros, g_idx)
    err = np.linalg.norm(lin.qweight.dequantize() - want) / np.linalg.norm(want)
    assert 0 < err < 0.3
    # 2-bit codes: neither format.
    t2, _ = gptq_layer(64, 16, 32, bits=2, seed=3)
    folder = save(tmp_path, {"l": t2}, bits=2, gs=32, name="two")
    with pytest.raises(FormatError, match="2-bit"):
        load_gptq(folder, "l")


def test_corrupt_and_truncated_tensors_name_themselves(tmp_path):
    tensors, _ = gptq_layer(256, 16, 128, seed=4)
    cases = {
        "l.scales": (dict(tensors, scales=tensors["scales"].astype(np.int32)), "'l.scales'"),
        "l.g_idx": (dict(tensors, g_idx=tensors["g_idx"] + 7), "'l.g_idx'"),
        "l.qzeros": (dict(tensors, qzeros=tensors["qzeros"][:, :1]), "qzeros"),
        "l.bias": (dict(tensors, bias=tensors["bias"][:3]), "'l.bias'"),
    }
    nan = tensors["scales"].copy()
    nan[1, 2] = np.inf
    cases["inf scale"] = (dict(tensors, scales=nan), r"'l.scales'.*\[1, 2\]")
    for key, (bad, match) in cases.items():
        folder = save(tmp_path, {"l": bad}, name=key.replace(" ", "_"))
        with pytest.raises(FormatError, match=match) as e:
            load_gptq(folder, "l")
        assert isinstance(e.value, quantrs.QuantError), key
    folder = save(tmp_path, {"l": tensors}, name="trunc")
    path = Path(folder) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(FormatError, match="truncated") as e:
        load_gptq(folder, "l")
    assert isinstance(e.value, quantrs.SerializationError)


def test_old_quantrs_layers_and_int_zp_blobs_round_trip(tmp_path):
    tensors, _ = gptq_layer(256, 16, 64, act=True, bits=8, seed=6)
    folder = save(tmp_path, {"l": tensors}, bits=8, gs=64)
    lin = load_gptq(folder, "l")
    blob = lin.serialize()
    back = quantrs.QuantLinear.deserialize(blob)
    assert back.serialize() == blob
    np.testing.assert_array_equal(back.dequantize_w(), lin.dequantize_w())
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(quantrs.SerializationError):
        quantrs.QuantLinear.deserialize(bytes(bad))
    # A symmetric file still gives the INT4 layer whose bytes earlier versions wrote.
    sym, _ = gptq_layer(256, 16, 64, sym=True, seed=7)
    save_file({f"s.{k}": v for k, v in sym.items()}, str(tmp_path / "s.safetensors"))
    old = load_gptq(tmp_path / "s.safetensors", "s")
    assert isinstance(old, quantrs.Int4Linear)
    assert quantrs.Int4Linear.deserialize(old.serialize()).serialize() == old.serialize()


def test_from_parts_checks_every_part():
    codes = np.zeros((2, 64), np.uint8)
    sc = np.ones((2, 2), np.float16)
    z = np.zeros((2, 2), np.uint8)
    ok = quantrs.IntZpWeight.from_parts(codes, sc, z, group_size=32)
    assert ok.nbytes == 64 + 8 + 4 and ok.perm is None
    bad = [
        ({"codes": codes.astype(np.int32)}, TypeError, "codes: expected dtype uint8"),
        ({"scales": sc.astype(np.float32)}, TypeError, "scales: expected dtype float16"),
        ({"zeros": z[:, :1]}, quantrs.DimensionMismatch, "zeros"),
        ({"zeros": z + 16}, quantrs.InvalidArgument, r"zeros\[0, 0\] is 16"),
        ({"codes": codes + 16}, quantrs.InvalidArgument, r"codes\[0, 0\] is 16"),
        ({"scales": np.full((2, 2), np.inf, np.float16)}, quantrs.InvalidArgument, "scales"),
        ({"perm": np.zeros(64, np.int64)}, quantrs.InvalidArgument, "perm"),
        ({"perm": np.arange(3)}, quantrs.DimensionMismatch, "perm"),
        ({"bits": 3}, quantrs.InvalidArgument, "bits"),
        ({"group_size": 48}, quantrs.QuantError, "group_size"),
    ]
    for change, exc, match in bad:
        args = {"codes": codes, "scales": sc, "zeros": z, "group_size": 32} | change
        with pytest.raises(exc, match=match):
            quantrs.IntZpWeight.from_parts(
                args.pop("codes"), args.pop("scales"), args.pop("zeros"), **args
            )
    with pytest.raises(quantrs.QuantError, match="rows 1..9"):
        ok.dequantize_rows(1, 9)
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        ok.matmul(np.zeros((1, 63), np.float32))
