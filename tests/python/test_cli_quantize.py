"""`quantrs quantize` and `quantrs inspect`: round trips, layouts, bad files, memory."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from _helpers import peak_rss
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import save_file

import quantrs
from quantrs.cli import load_int4, main
from quantrs.reference import pack_int4, quantize_int4

HAS_INT4 = hasattr(quantrs, "QuantizedWeight")
HAS_FP8 = hasattr(quantrs, "PerTensorFP8Linear") and hasattr(quantrs, "fp8")
needs_int4 = pytest.mark.skipif(not HAS_INT4, reason="QuantizedWeight not built")
needs_fp8 = pytest.mark.skipif(not HAS_FP8, reason="PerTensorFP8Linear not built")


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (truncation is enough for test data)."""
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.fixture
def ckpt(tmp_path):
    """A small checkpoint with every case: F32/F16 2-D weights (odd and tiny in_feat),
    1-D biases, integer tensors, an empty 2-D tensor, a scalar."""
    rng = np.random.default_rng(7)
    tensors = {
        "model.layers.0.q_proj.weight": rng.standard_normal((96, 70)).astype(np.float32),
        "model.layers.0.q_proj.bias": rng.standard_normal(96).astype(np.float32),
        "model.layers.0.o_proj.weight": rng.standard_normal((40, 130)).astype(np.float32),
        "model.embed.weight": (rng.standard_normal((33, 17)) * 3).astype(np.float16),
        "model.tiny.weight": rng.standard_normal((5, 1)).astype(np.float32),
        "model.f64.weight": rng.standard_normal((8, 64)),
        "ids": np.arange(10, dtype=np.int64),
        "empty": np.zeros((0, 5), np.float32),
        "scalar": np.array(3.0, np.float64),
    }
    path = tmp_path / "in.safetensors"
    save_file(tensors, str(path), metadata={"source": "test"})
    return path, tensors


def quantize(src, dst, *extra) -> int:
    # every 2-D float tensor, FP8 as weight_scale_inv (docs/checkpoints.md has the defaults)
    opts = ["--include", "*", "--layout", "mistralrs"]
    return main(["quantize", str(src), str(dst), "--no-progress", *opts, *extra])


def weights_2d(tensors):
    return {k: v for k, v in tensors.items() if v.ndim == 2 and v.size}


# --- round trips -------------------------------------------------------------------------


@needs_int4
@pytest.mark.parametrize("group_size", [32, 128, 2])
def test_int4_round_trip_bit_exact(ckpt, tmp_path, capsys, group_size):
    src, tensors = ckpt
    dst = tmp_path / "out.safetensors"
    # --method rtn: the absmax / 7 grid the NumPy oracle below implements
    argv = ("--format", "int4", "--group-size", str(group_size), "--method", "rtn")
    assert quantize(src, dst, *argv) == 0
    for name, w in weights_2d(tensors).items():
        got = load_int4(dst, name)
        want = quantrs.QuantizedWeight.quantize(
            np.ascontiguousarray(w.astype(np.float32).T), group_size=group_size, method="rtn"
        )
        assert got == want, name
        assert np.array_equal(got.dequantize(), want.dequantize())
        # and against the pure-NumPy oracle, from the file's raw tensors
        q, scales = quantize_int4(w.astype(np.float32).T, group_size)
        with safe_open(str(dst), "numpy") as f:
            assert np.array_equal(f.get_tensor(name + ".qweight").reshape(-1), pack_int4(q))
            assert np.array_equal(f.get_tensor(name + ".scales"), scales)
        assert (got.in_feat, got.out_feat) == (w.shape[1], w.shape[0])
    # everything else is copied bit for bit, metadata kept
    with safe_open(str(dst), "numpy") as f:
        assert f.metadata()["source"] == "test"
        for name, a in tensors.items():
            if name not in weights_2d(tensors):
                assert np.array_equal(f.get_tensor(name), a), name
                assert f.get_tensor(name).dtype == a.dtype
        assert not any(k in f.keys() for k in weights_2d(tensors))
    report = capsys.readouterr().out
    assert "model.layers.0.q_proj.weight" in report and "int4" in report


@needs_int4
@pytest.mark.parametrize("method", ["full", "search", None])
def test_int4_method_flag(ckpt, tmp_path, method):
    src, tensors = ckpt
    dst = tmp_path / "out.safetensors"
    flag = () if method is None else ("--method", method)
    assert quantize(src, dst, "--format", "int4", "--group-size", "64", *flag) == 0
    for name, w in weights_2d(tensors).items():
        want = quantrs.QuantizedWeight.quantize(
            np.ascontiguousarray(w.astype(np.float32).T),
            group_size=64,
            method=method or "search",  # the default
        )
        assert load_int4(dst, name) == want, name
        assert (
            want
            != quantrs.QuantizedWeight.quantize(
                np.ascontiguousarray(w.astype(np.float32).T), group_size=64, method="rtn"
            )
            or w.shape[1] < 2
        ), name
    # GPTQ needs calibration text, which needs a model folder
    assert quantize(src, tmp_path / "x.safetensors", "--format", "int4", "--method", "gptq") == 1


@needs_int4
def test_int4_bf16_input(tmp_path):
    w = np.random.default_rng(1).standard_normal((24, 48)).astype(np.float32)
    bits = bf16(w)
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    _write_raw(src, {"w": ("BF16", [24, 48], bits.tobytes())})
    assert quantize(src, dst, "--format", "int4") == 0
    exact = (bits.astype(np.uint32) << 16).view(np.float32)
    want = quantrs.QuantizedWeight.quantize(np.ascontiguousarray(exact.T))
    assert load_int4(dst, "w") == want
    if HAS_FP8:
        dst8 = tmp_path / "out8.safetensors"
        assert quantize(src, dst8, "--format", "fp8") == 0
        import safetensors

        raw = dict(safetensors.deserialize(dst8.read_bytes()))
        want8 = quantrs.PerTensorFP8Linear.from_float(exact)
        codes = np.frombuffer(bytes(raw["w"]["data"]), np.uint8).reshape(24, 48)
        scale = np.frombuffer(bytes(raw["w_scale_inv"]["data"]), "<f4")[0]
        assert np.array_equal(codes, np.asarray(want8.weight).reshape(24, 48))
        assert scale == np.float32(want8.weight_scale_inv)


@needs_fp8
def test_fp8_round_trip_bit_exact(ckpt, tmp_path):
    src, tensors = ckpt
    dst = tmp_path / "out.safetensors"
    assert quantize(src, dst, "--format", "fp8") == 0
    for name, w in weights_2d(tensors).items():
        prefix = name.removesuffix(".weight")
        bias = tensors.get(prefix + ".bias")  # copied, and picked up by from_safetensors
        want = quantrs.PerTensorFP8Linear.from_float(w.astype(np.float32), bias=bias)
        if name.endswith(".weight"):
            got = quantrs.PerTensorFP8Linear.from_safetensors(str(dst), prefix)
            assert np.array_equal(got.dequantize_w(), want.dequantize_w()), name
            x = np.random.default_rng(0).standard_normal((3, w.shape[1])).astype(np.float32)
            assert np.array_equal(got.forward(x), want.forward(x)), name
            if bias is not None:
                assert np.array_equal(got.bias, bias)
    # raw bytes through the safetensors library itself (its NumPy backend has no FP8 dtype)
    import safetensors

    raw = dict(safetensors.deserialize(dst.read_bytes()))
    w = tensors["model.layers.0.q_proj.weight"]
    entry = raw["model.layers.0.q_proj.weight"]
    assert entry["dtype"] == "F8_E4M3" and entry["shape"] == [96, 70]
    scale = np.frombuffer(bytes(raw["model.layers.0.q_proj.weight_scale_inv"]["data"]), "<f4")
    assert raw["model.layers.0.q_proj.weight_scale_inv"]["shape"] == []
    codes = np.frombuffer(bytes(entry["data"]), np.uint8).reshape(96, 70)
    deq = quantrs.fp8.decode(codes, "e4m3") * scale[0]
    want = quantrs.PerTensorFP8Linear.from_float(w).dequantize_w()
    assert np.array_equal(deq, want)


@needs_fp8
def test_fp8_ml_dtypes_cross_check(ckpt, tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    src, tensors = ckpt
    dst = tmp_path / "out.safetensors"
    assert quantize(src, dst, "--format", "fp8") == 0
    import safetensors

    raw = dict(safetensors.deserialize(dst.read_bytes()))
    w = tensors["model.layers.0.o_proj.weight"]
    scale = np.frombuffer(bytes(raw["model.layers.0.o_proj.weight_scale_inv"]["data"]), "<f4")[0]
    codes = np.frombuffer(bytes(raw["model.layers.0.o_proj.weight"]["data"]), np.uint8)
    deq = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32).reshape(w.shape) * scale
    # per-tensor E4M3: relative error of each element at most 2^-4 above the subnormal range
    assert np.abs(deq).max() <= np.abs(w).max() * (1 + 1e-6)
    big = np.abs(w) > scale * 2**-6 * 8
    assert np.all(np.abs(deq - w)[big] <= np.abs(w)[big] * 2**-4 + 1e-7)


def test_copy_only_file_needs_no_quantizer(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.int32), "b": np.ones(3, np.float16)}
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(tensors, str(src))
    assert main(["quantize", str(src), str(dst), "--format", "int4"]) == 0  # with tqdm
    with safe_open(str(dst), "numpy") as f:
        assert sorted(f.keys()) == ["a", "b"]
        assert np.array_equal(f.get_tensor("a"), tensors["a"])


# --- inspect ------------------------------------------------------------------------------


@needs_int4
def test_inspect_marks_int4(ckpt, tmp_path, capsys):
    src, _ = ckpt
    dst = tmp_path / "out.safetensors"
    assert quantize(src, dst, "--format", "int4") == 0
    capsys.readouterr()
    assert main(["inspect", str(dst), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantrs_format"] == "int4"
    kinds = {t["name"]: t["kind"] for t in info["tensors"]}
    assert kinds["model.layers.0.q_proj.weight.qweight"].startswith("int4 of")
    assert "group 32" in kinds["model.layers.0.q_proj.weight.scales"]
    assert kinds["ids"] == "-"
    assert main(["inspect", str(dst)]) == 0
    assert "format: int4" in capsys.readouterr().out


@needs_fp8
def test_inspect_marks_fp8(ckpt, tmp_path, capsys):
    src, _ = ckpt
    dst = tmp_path / "out.safetensors"
    assert quantize(src, dst, "--format", "fp8") == 0
    capsys.readouterr()
    assert main(["inspect", str(dst), "--json"]) == 0
    kinds = {t["name"]: t["kind"] for t in json.loads(capsys.readouterr().out)["tensors"]}
    assert kinds["model.embed.weight"].startswith("fp8 e4m3, per-tensor scale")
    assert kinds["model.embed.weight_scale_inv"] == "fp8 scale of model.embed.weight"


def test_inspect_plain_file(ckpt, capsys):
    src, tensors = ckpt
    assert main(["inspect", str(src), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["quantrs_format"] is None
    by_name = {t["name"]: t for t in info["tensors"]}
    assert set(by_name) == set(tensors)
    for name, a in tensors.items():
        assert by_name[name]["shape"] == list(a.shape)
        assert by_name[name]["bytes"] == a.nbytes
    assert by_name["model.embed.weight"]["dtype"] == "F16"
    assert info["file_bytes"] == src.stat().st_size


# --- bad input: one line, non-zero exit, no output file ------------------------------------


def _write_raw(path, entries: dict, header_extra: bytes = b"", data_extra: bytes = b""):
    """A hand-made safetensors file (to build malformed ones)."""
    header, data, off = {}, b"", 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    h = json.dumps(header).encode() + header_extra
    path.write_bytes(struct.pack("<Q", len(h)) + h + data + data_extra)


def _corrupt_files(tmp_path, ckpt_path):
    good = ckpt_path.read_bytes()
    (n,) = struct.unpack("<Q", good[:8])
    w = np.ones((4, 4), np.float32).tobytes()
    cases = {
        "truncated": good[: len(good) - 100],
        "truncated_header": good[: 8 + n // 2],
        "empty": b"",
        "short": b"\x01\x02",
        "huge_header_len": struct.pack("<Q", 1 << 60) + good[8:],
        "not_json": struct.pack("<Q", 9) + b"not json!" + w,
        "trailing_bytes": good + b"\0" * 8,
    }
    paths = {k: tmp_path / f"{k}.safetensors" for k in cases}
    for k, raw in cases.items():
        paths[k].write_bytes(raw)
    _write_raw(tmp_path / "bad_dtype.safetensors", {"w": ("Q9", [4, 4], w)})
    _write_raw(tmp_path / "bad_size.safetensors", {"w": ("F32", [4, 5], w)})
    _write_raw(tmp_path / "neg_shape.safetensors", {"w": ("F32", [-4, -4], w)})
    _write_raw(tmp_path / "bad_entry.safetensors", {"w": ("F32", "4x4", w)})
    _write_raw(tmp_path / "float_shape.safetensors", {"w": ("F32", [4.0, 4], w)})
    overlap = tmp_path / "overlap.safetensors"
    h = json.dumps(
        {
            "a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
            "b": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]},
        }
    ).encode()
    overlap.write_bytes(struct.pack("<Q", len(h)) + h + w)
    for k in ("bad_dtype", "bad_size", "neg_shape", "bad_entry", "float_shape", "overlap"):
        paths[k] = tmp_path / f"{k}.safetensors"
    return paths


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_bad_inputs_one_line_and_no_output(ckpt, tmp_path, capsys, fmt):
    src, _ = ckpt
    for kind, path in _corrupt_files(tmp_path, src).items():
        dst = tmp_path / f"out_{kind}.safetensors"
        assert quantize(path, dst, "--format", fmt) == 1, kind
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("quantrs quantize: error:"), (kind, err)
        assert "Traceback" not in err
        assert not dst.exists(), kind
        assert main(["inspect", str(path)]) == 1, kind
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("quantrs inspect: error:"), (kind, err)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_missing_input_and_bad_arguments(ckpt, tmp_path, capsys):
    src, _ = ckpt
    dst = tmp_path / "out.safetensors"
    (tmp_path / "no_model").mkdir()  # a folder IN must hold a model
    cases = [
        ([str(tmp_path / "nope.safetensors"), str(dst), "--format", "int4"], "no such file"),
        ([str(tmp_path / "no_model"), str(dst), "--format", "int4"], "no .safetensors file"),
        ([str(src), str(tmp_path / "no" / "dir.st"), "--format", "fp8"], "does not exist"),
        ([str(src), str(dst), "--format", "int4", "--group-size", "3"], "even"),
        ([str(src), str(src), "--format", "int4"], "differ"),
        ([str(src), str(tmp_path), "--format", "int4"], "is a directory"),
    ]
    for argv, needle in cases:
        assert main(["quantize", "--no-progress", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, (argv, err)
        assert not dst.exists()
    assert src.exists()
    with pytest.raises(SystemExit) as e:
        main(["quantize", str(src), str(dst), "--format", "int2"])
    assert e.value.code == 2


@needs_int4
def test_non_finite_weight_fails_cleanly(tmp_path, capsys):
    w = np.ones((8, 8), np.float32)
    w[3, 5] = np.nan
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"a": np.ones((4, 4), np.float32), "w": w}, str(src))
    for fmt in ("int4",) + (("fp8",) if HAS_FP8 else ()):
        assert quantize(src, dst, "--format", fmt) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'w'" in err, err
        assert not dst.exists()
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors"]  # no temp file left either


def test_requantizing_quantrs_output_is_refused(tmp_path, capsys):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file({"a": np.ones(3, np.float32)}, str(src), metadata={"quantrs.format": "int4"})
    assert quantize(src, dst, "--format", "int4") == 1
    assert "already quantized" in capsys.readouterr().err
    assert not dst.exists()


def test_name_clash_is_refused(tmp_path, capsys):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(
        {"x.weight": np.ones((4, 4), np.float32), "x.weight_scale_inv": np.ones(())}, str(src)
    )
    assert quantize(src, dst, "--format", "fp8") == 1
    assert "clashes" in capsys.readouterr().err
    assert not dst.exists()


def test_existing_output_untouched_on_failure(ckpt, tmp_path):
    src, _ = ckpt
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(src.read_bytes()[:-10])
    dst = tmp_path / "out.safetensors"
    dst.write_bytes(b"precious")
    assert quantize(bad, dst, "--format", "int4") == 1
    assert dst.read_bytes() == b"precious"


# --- memory ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int4", "fp8"])
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_quantize_peak_memory(tmp_path, fmt):
    if not (HAS_INT4 if fmt == "int4" else HAS_FP8):
        pytest.skip(f"{fmt} not built")
    rng = np.random.default_rng(0)
    largest = 128 << 20  # a 128 MiB float32 tensor, 4096 x 8192
    shapes = {"big.weight": (4096, 8192), "mid.weight": (2048, 8192), "small.weight": (1024, 4096)}
    src = tmp_path / "in.safetensors"
    tensors = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    tensors["norm"] = np.ones(4096, np.float32)
    save_file(tensors, str(src))
    total = sum(a.nbytes for a in tensors.values())
    del tensors
    assert total > 190 << 20
    base = peak_rss()  # the interpreter with numpy and quantrs imported
    dst = tmp_path / "out.safetensors"
    peak = peak_rss("quantize", str(src), str(dst), "--format", fmt, "--no-progress")
    assert dst.exists()
    assert peak - base < 2 * largest, (peak - base) / largest
    # and well below the file size plus its float32 copy, the naive approach
    assert peak - base < total


@needs_fp8
@pytest.mark.parametrize(
    "case", ["normal", "tiny", "huge", "zeros", "constant", "one", "ties", "subnormal_mix"]
)
def test_streamed_fp8_matches_from_float(case):
    """quantize encodes FP8 in row blocks; it must agree with from_float bit for bit."""
    from quantrs.cli._convert import fp8_quantize

    rng = np.random.default_rng(3)
    w = rng.standard_normal((37, 300)).astype(np.float32)
    w = {
        "normal": w,
        "tiny": w * np.float32(1e-35),
        "huge": w * np.float32(1e36),
        "zeros": np.zeros_like(w),
        "constant": np.full_like(w, -2.5),
        "one": np.array([[0.75]], np.float32),
        # values that land exactly between two E4M3 codes after scaling (absmax 448)
        "ties": np.array([[448.0, 17.0, 19.0, -21.0, 0.0048828125, 1.0625]], np.float32),
        "subnormal_mix": np.where(rng.random(w.shape) < 0.5, w, w * np.float32(1e-6)),
    }[case]
    want = quantrs.PerTensorFP8Linear.from_float(w)
    codes, scale = fp8_quantize(quantrs.fp8, w)
    assert scale == np.float32(want.weight_scale_inv)
    assert np.array_equal(codes, np.asarray(want.weight).reshape(w.shape))


@needs_int4
def test_inspect_quantized_weight_save_file(tmp_path, capsys):
    path = tmp_path / "qw.safetensors"
    quantrs.QuantizedWeight.quantize(np.ones((70, 5), np.float32)).save(str(path))
    assert main(["inspect", str(path), "--json"]) == 0
    kinds = {t["name"]: t["kind"] for t in json.loads(capsys.readouterr().out)["tensors"]}
    assert kinds == {
        "data": "int4 QuantizedWeight [70x5], group 32: packed codes",
        "scales": "int4 QuantizedWeight [70x5], group 32: scales",
    }


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_reader_fuzz_never_crashes(data, tmp_path_factory):
    """Any truncation or byte flip of a valid file either reads or raises StFormatError."""
    from quantrs.formats._stfile import StFormatError, StReader

    path = tmp_path_factory.mktemp("fuzz") / "f.safetensors"
    save_file(
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.int8)},
        str(path),
        metadata={"k": "v"},
    )
    raw = bytearray(path.read_bytes())
    if data.draw(st.booleans(), "truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), "length")]
    else:
        for _ in range(data.draw(st.integers(1, 4), "flips")):
            i = data.draw(st.integers(0, len(raw) - 1), "index")
            raw[i] = data.draw(st.integers(0, 255), "byte")
    path.write_bytes(bytes(raw))
    try:
        with StReader(path) as r:
            for t in r.tensors:
                assert r.raw(t).nbytes == t.nbytes
    except StFormatError:
        pass
