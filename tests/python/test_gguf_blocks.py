"""GGUF block weights (``quantrs.GgufWeight``) against the ``gguf`` package:
every type's dequantization equals ``gguf.quants.dequantize`` bit for bit on
random blocks (random code bytes, finite half scales of both signs) and on a
file written by ``GGUFWriter``; ``matmul`` against a float64 product."""

from __future__ import annotations

import numpy as np
import pytest

import quantrs
from quantrs.formats import FormatError
from quantrs.formats.gguf import GgufFile, load_gguf_packed, packed_weight

gguf = pytest.importorskip("gguf")
from gguf import quants  # noqa: E402

# type -> (weights per block, bytes per block, byte offsets of the half scales)
TYPES = {
    "Q8_0": (32, 34, [0]),
    "Q4_0": (32, 18, [0]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
}


def random_blocks(name: str, out: int, inf: int, seed: int) -> np.ndarray:
    """``[out, in / elems * bytes]`` uint8: random bytes, every half scale finite
    (exponent field 0..30) with a random sign."""
    elems, size, halves = TYPES[name]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (out, inf // elems, size), dtype=np.uint8)
    for o in halves:
        h = (rng.integers(0, 31, b.shape[:2]) << 10) | rng.integers(0, 1 << 10, b.shape[:2])
        h |= rng.integers(0, 2, b.shape[:2]) << 15
        b[..., o : o + 2] = h.astype("<u2")[..., None].view(np.uint8)
    return b.reshape(out, -1)


def reference(name: str, blocks: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return quants.dequantize(blocks, gguf.GGMLQuantizationType[name])


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_gguf_bit_for_bit(name):
    out, inf = 6, 1024
    blocks = random_blocks(name, out, inf, seed=len(name) + 3 * TYPES[name][1])
    w = quantrs.GgufWeight.from_bytes(name.lower(), (out, inf), blocks)
    assert (w.type, w.shape, w.nbytes) == (name.lower(), (out, inf), blocks.size)
    got = w.dequantize()
    want = reference(name, blocks)
    assert got.shape == want.shape == (out, inf)
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(w.to_bytes(), blocks.reshape(-1))


@pytest.mark.kernel
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("batch", [1, 16, 40])
def test_matmul_within_f32_rounding_of_float64(name, batch):
    out, inf = 9, 512
    blocks = random_blocks(name, out, inf, seed=batch)
    # Small scales keep the values in a range where products do not overflow.
    w = quantrs.GgufWeight.from_bytes(name.lower(), (out, inf), blocks)
    wd = w.dequantize().astype(np.float64)
    wd[~np.isfinite(wd)] = 0
    if not np.isfinite(w.dequantize()).all():
        pytest.skip("random scales overflowed")
    x = np.random.default_rng(batch).standard_normal((batch, inf)).astype(np.float32)
    y = w.matmul(x)
    exact = x.astype(np.float64) @ wd.T
    # f32 accumulation of `in` exact products in any order: in * eps * sum |w x|.
    bound = (inf + 1) * np.finfo(np.float32).eps * (np.abs(x.astype(np.float64)) @ np.abs(wd).T)
    assert y.shape == (batch, out)
    assert np.all(np.abs(y - exact) <= bound)
    # Leading dims are kept: [2, batch, in] -> [2, batch, out] (2 * batch rows may take
    # another path of the row engine: the same bound, not the same bits).
    y2 = w.matmul(np.stack([x, x]))
    assert y2.shape == (2, batch, out)
    assert np.all(np.abs(y2 - exact) <= bound)


def write_file(path, tensors):
    writer = gguf.GGUFWriter(str(path), "llama")
    for tname, name, blocks, _shape in tensors:
        writer.add_tensor(
            tname, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType[name]
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_file_written_by_gguf_loads_exactly(tmp_path):
    rng = np.random.default_rng(0)
    tensors = []
    for name in TYPES:
        out, inf = 3, 512
        if name in ("Q4_K", "Q5_K", "Q6_K"):  # gguf.quants has no K-type quantizer
            blocks = random_blocks(name, out, inf, seed=7)
        else:
            w = rng.standard_normal((out, inf)).astype(np.float32)
            blocks = quants.quantize(w, gguf.GGMLQuantizationType[name])
        tensors.append((f"blk.0.{name.lower()}.weight", name, blocks, (out, inf)))
    path = tmp_path / "m.gguf"
    write_file(path, tensors)
    with GgufFile(path) as g:
        for tname, name, blocks, shape in tensors:
            t = g.tensor(tname)
            assert t.type_name == name and t.shape == shape
            w = packed_weight(g, t)
            want = reference(name, blocks).astype(np.float32)
            np.testing.assert_array_equal(w.dequantize().view(np.uint32), want.view(np.uint32))
    w = load_gguf_packed(path, "blk.0.q6_k.weight")
    assert w.type == "q6_k" and w.shape == (3, 512)


def test_corrupt_blocks_raise_naming_the_tensor(tmp_path):
    blocks = random_blocks("Q4_K", 2, 256, seed=1)
    blocks[1, 0:2] = np.array([0x00, 0x7E], np.uint8)  # NaN half d in row 1
    path = tmp_path / "bad.gguf"
    write_file(path, [("blk.3.ffn_up.weight", "Q4_K", blocks, (2, 256))])
    with pytest.raises(FormatError, match=r"blk\.3\.ffn_up\.weight.*row 1 block 0"):
        load_gguf_packed(path, "blk.3.ffn_up.weight")
    with pytest.raises(quantrs.SerializationError):
        load_gguf_packed(path, "blk.3.ffn_up.weight")


def test_bad_arguments_are_named():
    blocks = random_blocks("Q8_0", 2, 64, seed=2)
    with pytest.raises(quantrs.InvalidArgument, match="type"):
        quantrs.GgufWeight.from_bytes("q2_k", (2, 64), blocks)
    with pytest.raises(quantrs.DimensionMismatch):
        quantrs.GgufWeight.from_bytes("q8_0", (2, 64), blocks.reshape(-1)[:-1])
    with pytest.raises(quantrs.InvalidArgument, match="multiple of 32"):
        quantrs.GgufWeight.from_bytes("q8_0", (4, 32 + 1), blocks)
    with pytest.raises(TypeError):
        quantrs.GgufWeight.from_bytes("q8_0", (2, 64), blocks.astype(np.int16))
    w = quantrs.GgufWeight.from_bytes("Q8_0", (2, 64), blocks)
    with pytest.raises(quantrs.DimensionMismatch, match="x"):
        w.matmul(np.zeros((3, 63), np.float32))


def test_cli_inspect_and_convert_keep_a_q8_0_embedding(tmp_path):
    from safetensors.numpy import load_file

    from quantrs.cli._import import convert
    from quantrs.cli._inspect import inspect_path

    emb = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    blocks = quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0)
    path = tmp_path / "m.gguf"
    write_file(path, [("token_embd.weight", "Q8_0", blocks, (8, 64))])
    rows = inspect_path(path)["tensors"]
    assert rows == [
        {
            "name": "token_embd.weight",
            "dtype": "Q8_0",
            "shape": [8, 64],
            "bytes": blocks.size,
            "kind": "gguf q8_0: packed GgufWeight",
        }
    ]
    convert(path, tmp_path / "out.safetensors", "gguf", progress=False)
    # kept as its ggml blocks (the embedding included), bit for bit
    got = load_file(str(tmp_path / "out.safetensors"))["token_embd.weight.blocks"]
    np.testing.assert_array_equal(got, blocks)
