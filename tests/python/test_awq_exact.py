"""AWQ (GEMM packing) checkpoints loaded exactly (docs/checkpoints.md): asymmetric
groups into ``int_zp``, against the AWQ formula computed here in NumPy, bit for bit; the
forward against float64 within the fused kernel's bound; refusals naming the tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _zp_packing import (
    AWQ_ORDER,
    every_code,
    fused_bound,
    pack_along_cols,
    reference,
    scales_both_signs,
    write_checkpoint,
    zeros_with_edges,
)

import quantrs
from quantrs.formats import Checkpoint, FormatError, RequantizedWarning, load_awq
from quantrs.formats.awq import read_awq
from quantrs.torch import GgufLinear


def awq_layer(in_feat, out, gs, seed=0, scales_dtype=np.float16):
    rng = np.random.default_rng(seed)
    groups = -(-in_feat // gs)
    q = every_code((in_feat, out), 4, rng)
    zeros = zeros_with_edges((groups, out), 4, rng)
    scales = scales_both_signs((groups, out), rng).astype(scales_dtype)
    tensors = {
        "qweight": pack_along_cols(q, 4, AWQ_ORDER),
        "qzeros": pack_along_cols(zeros, 4, AWQ_ORDER),
        "scales": scales,
        "bias": rng.standard_normal(out).astype(np.float16),
    }
    return tensors, (q, zeros, scales, np.arange(in_feat) // gs)


def save(tmp_path, tensors, gs, name="m"):
    config = {"quant_method": "awq", "bits": 4, "group_size": gs, "version": "gemm",
              "zero_point": True}  # fmt: skip
    return write_checkpoint(tmp_path / name, config, {f"p.{k}": v for k, v in tensors.items()})


def test_awq_order_packs_as_autoawq():
    # AutoAWQ packs columns [0, 2, 4, 6, 1, 3, 5, 7] into fields 0..7 of each word.
    q = np.arange(8, dtype=np.uint8)[None, :]
    word = int(pack_along_cols(q, 4, AWQ_ORDER).view(np.uint32)[0, 0])
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == AWQ_ORDER


@pytest.mark.kernel
@pytest.mark.parametrize("in_feat,out,gs", [(256, 32, 128), (576, 16, 128), (128, 24, 32),
                                            (192, 8, 64)])  # fmt: skip
def test_awq_loads_bit_exact(tmp_path, in_feat, out, gs):
    tensors, (q, zeros, scales, g) = awq_layer(in_feat, out, gs, seed=in_feat)
    folder = save(tmp_path, tensors, gs)
    want = reference(q, scales, zeros, g)
    with Checkpoint(folder) as ck:
        imp = read_awq(ck, "p")
        file_bytes = sum(ck.info(f"p.{k}").nbytes for k in ("qweight", "qzeros", "scales"))
    w = imp.qweight
    assert isinstance(w, quantrs.IntZpWeight) and w.perm is None
    assert w.nbytes <= 1.2 * file_bytes
    np.testing.assert_array_equal(w.zeros(), zeros.T)
    assert np.array_equal(
        w.dequantize().view(np.uint32), np.ascontiguousarray(want.T).view(np.uint32)
    )
    bias = tensors["bias"].astype(np.float64)
    lin = load_awq(folder, "p")
    assert lin.format == "int_zp"
    for rows in (1, 5, 40):
        x = np.random.default_rng(rows).standard_normal((rows, in_feat)).astype(np.float32)
        ref = x.astype(np.float64) @ want.astype(np.float64) + bias
        bound = fused_bound(x, scales, q, zeros, g, bias)
        assert (np.abs(lin.forward(x) - ref) <= bound).all()
    mod = GgufLinear(w, torch.from_numpy(imp.bias))
    x = torch.randn(2, in_feat)
    ref = x.double() @ torch.from_numpy(want).double() + torch.from_numpy(bias)
    torch.testing.assert_close(mod(x).double(), ref, rtol=1e-4, atol=1e-3)


def test_symmetric_awq_keeps_loading_into_int4(tmp_path):
    tensors, (q, _, scales, g) = awq_layer(128, 16, 64, seed=1)
    eight = np.full((2, 16), 8, np.int64)
    tensors["qzeros"] = pack_along_cols(eight, 4, AWQ_ORDER)
    lin = load_awq(save(tmp_path, tensors, 64), "p")
    assert isinstance(lin, quantrs.Int4Linear)
    want = reference(q, scales, eight, g)
    assert np.array_equal(lin.qweight.dequantize().view(np.uint32), want.view(np.uint32))


def test_scales_float16_cannot_hold_are_refused_or_requantized(tmp_path):
    tensors, (q, zeros, scales, g) = awq_layer(128, 16, 64, seed=2, scales_dtype=np.float32)
    tensors["scales"] = tensors["scales"] * np.float32(1.0001)
    folder = save(tmp_path, tensors, 64)
    with pytest.raises(FormatError, match=r"'p'.*int_zp: F32 scales that float16 cannot hold"):
        load_awq(folder, "p")
    with pytest.warns(RequantizedWarning):
        load_awq(folder, "p", requantize=True)
    # F32 scales that are halves load exactly.
    tensors["scales"] = scales.astype(np.float32)
    with Checkpoint(save(tmp_path, tensors, 64, "ok")) as ck:
        w = read_awq(ck, "p").qweight
    want = reference(q, scales, zeros, g)
    assert np.array_equal(w.dequantize(), want.T)


def test_corrupt_tensors_name_themselves(tmp_path):
    tensors, _ = awq_layer(128, 16, 64, seed=3)
    cases = [
        (dict(tensors, qweight=tensors["qweight"].astype(np.float32)), "'p.qweight'"),
        (dict(tensors, qzeros=tensors["qzeros"][:1]), "qzeros"),
        (dict(tensors, scales=np.full((2, 16), np.nan, np.float16)), r"'p.scales'.*\[0, 0\]"),
    ]
    for i, (bad, match) in enumerate(cases):
        with pytest.raises(FormatError, match=match):
            load_awq(save(tmp_path, bad, 64, f"c{i}"), "p")
