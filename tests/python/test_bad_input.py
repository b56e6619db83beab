"""Untrusted input never takes the process down (docs/security.md): one
regression test per defect of the bad-input campaign, then a table of entry
points x kinds of bad argument asserting the exception class and that the
message names the argument."""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest

import quantrs
from quantrs import qat

RNG = np.random.default_rng(7)


# --- optimizer checkpoints (items 1, 2, 10) ---------------------------------


def trained():
    opt = quantrs.AdamW4bit(1e-3)
    p = RNG.standard_normal((4, 8)).astype(np.float32)
    opt.update(p, RNG.standard_normal((4, 8)).astype(np.float32), name="w")
    opt.step()
    return opt


def edited(sd, *, seal=None, **fields):
    """``sd`` with meta fields replaced. ``seal=1`` re-seals it as a version-1
    file (checksum over the other tensors only), ``seal=2`` as a version-2 one
    (the checksum continued over the canonical meta JSON): the strongest
    forgeries, which only validation can catch."""
    d = {k: v.copy() for k, v in sd.items()}
    m = json.loads(bytes(d["meta"]).decode())
    m.update(fields)
    if seal is not None:
        m["version"] = seal
        c = 0
        for name in sorted(k for k in d if k != "meta"):
            x = d[name]
            dt = {"uint8": "U8", "float32": "F32"}[x.dtype.name]
            c = zlib.crc32(name.encode() + b"\0", c)
            c = zlib.crc32(f"{dt}[{', '.join(map(str, x.shape))}]".encode(), c)
            c = zlib.crc32(x.tobytes(), c)
        if seal == 2:
            m.pop("checksum", None)
            c = zlib.crc32(json.dumps(m, sort_keys=True, separators=(",", ":")).encode(), c)
        m["checksum"] = c
    d["meta"] = np.frombuffer(json.dumps(m).encode(), np.uint8).copy()
    return d


def test_sealing_helper_matches_the_writer():
    sd = trained().state_dict()

    def checksum(d):
        return json.loads(bytes(d["meta"]).decode())["checksum"]

    assert checksum(edited(sd, seal=2)) == checksum(sd)


def test_legacy_checkpoint_still_loads():
    opt = trained()
    back = quantrs.AdamW4bit(1e-3)
    back.load_state_dict(edited(opt.state_dict(), seal=1))
    assert back.state().step == 1


@pytest.mark.parametrize("seal", [1, 2])
@pytest.mark.parametrize("shape", [[2**36, 7], [2**32, 7], [2**62, 2**62], [0, 5]])
def test_declared_shape_is_checked_before_allocating(shape, seal):
    sd = trained().state_dict()
    with pytest.raises(quantrs.SerializationError, match="n:w"):
        quantrs.AdamW4bit(1e-3).load_state_dict(edited(sd, seal=seal, params={"n:w": shape}))


def test_legacy_swapped_dims_fail_at_the_first_update():
    """A version-1 file's meta is unprotected: [8, 4] for a [4, 8] parameter
    has the right element count and loads (the optimizer holds no parameters
    on load to compare with; docs/security.md). The first update with the
    real array is refused, naming the state and both shapes, and changes
    nothing."""
    rng = np.random.default_rng(48)  # not RNG: the draws of the other tests stay as they were
    opt = quantrs.AdamW4bit(1e-3)
    shape = (4, 8)
    opt.update(rng.standard_normal(shape).astype(np.float32), np.ones(shape, np.float32), name="w")
    opt.step()
    forged = edited(opt.state_dict(), seal=1, params={"n:w": [8, 4]})
    back = quantrs.AdamW4bit(1e-3)
    back.load_state_dict(forged)
    assert back.state().params == {"n:w": (8, 4)}
    before = {k: v.copy() for k, v in back.state_dict().items()}
    p = rng.standard_normal(shape).astype(np.float32)
    p0 = p.copy()
    with pytest.raises(
        quantrs.DimensionMismatch,
        match=r"param shape \(state \"n:w\"\): expected \[8, 4\], got \[4, 8\]",
    ):
        back.update(p, np.ones((4, 8), np.float32), name="w")
    np.testing.assert_array_equal(p, p0)
    after = back.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    # a version-2 file with the same edit is a checksum mismatch on load
    with pytest.raises(quantrs.SerializationError, match="checksum"):
        quantrs.AdamW4bit(1e-3).load_state_dict(edited(opt.state_dict(), params={"n:w": [8, 4]}))


@pytest.mark.parametrize(
    "field",
    [
        {"step": 7},
        {"method": "int4"},
        {"variance_map": "linear"},
        {"block_size": 128},
        {"method": "bogus"},
    ],
)
def test_meta_is_covered_by_the_checksum(field):
    opt = trained()
    before = {k: v.copy() for k, v in opt.state_dict().items()}
    with pytest.raises(quantrs.SerializationError, match="checksum"):
        opt.load_state_dict(edited(before, **field))
    after = opt.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("seal", [1, 2])
@pytest.mark.parametrize("step", [2**64 - 1, 2**53 + 1])
def test_step_out_of_range_is_an_error_even_when_sealed(step, seal):
    sd = trained().state_dict()
    with pytest.raises(quantrs.SerializationError, match="step"):
        quantrs.AdamW4bit(1e-3).load_state_dict(edited(sd, seal=seal, step=step))


@pytest.mark.parametrize("seal", [1, 2])
def test_corrupt_method_is_a_serialization_error(seal):
    sd = trained().state_dict()
    with pytest.raises(quantrs.SerializationError, match="method"):
        quantrs.AdamW4bit(1e-3).load_state_dict(edited(sd, seal=seal, method="bogus"))


def test_pickle_of_a_forged_state_raises():
    opt = trained()
    blob = pickle.dumps(opt)
    forged = blob.replace(b'"step":1', b'"step":7')
    assert forged != blob
    with pytest.raises(quantrs.SerializationError):
        pickle.loads(forged)


def test_state_dict_dtype_error_names_the_dtype():
    sd = {k: v.copy() for k, v in trained().state_dict().items()}
    sd["config"] = sd["config"].astype(np.float64)
    with pytest.raises(TypeError, match="float64"):
        quantrs.AdamW4bit(1e-3).load_state_dict(sd)


# --- caller-chosen sizes (items 3, 9, 12) ------------------------------------


def test_rng_random_huge_is_memory_error():
    with pytest.raises(MemoryError, match="n"):
        quantrs.Rng(1).random(2**40)


@pytest.mark.parametrize("n", [2**62, 2**64, -1])
def test_rng_random_out_of_range_is_value_error(n):
    with pytest.raises(ValueError, match=r"n: expected an int in \[0, "):
        quantrs.Rng(1).random(n)


def test_rng_random_still_works():
    a = quantrs.Rng(3).random(5)
    assert a.shape == (5,) and np.all((a >= 0) & (a < 1))
    assert quantrs.Rng(3).random(np.int64(5)).shape == (5,)


# --- bytes and types (items 4, 6) --------------------------------------------


@pytest.mark.parametrize("data", [10**9, 2**31, 3.0, None, "abc", [1, 2]])
def test_layer_deserialize_wants_bytes(data):
    with pytest.raises(TypeError, match="data"):
        quantrs.PerTensorFP8Linear.deserialize(data)


def test_layer_deserialize_accepts_bytes_likes():
    layer = quantrs.PerTensorFP8Linear.from_float(RNG.standard_normal((4, 8)).astype(np.float32))
    blob = layer.serialize()
    for b in (blob, bytearray(blob), memoryview(blob)):
        assert quantrs.PerTensorFP8Linear.deserialize(b).serialize() == blob


@pytest.mark.parametrize("x", [None, "1.5", [None], {"a": 1}])
def test_fp8_encode_refuses_non_numbers(x):
    with pytest.raises(TypeError, match="x"):
        quantrs.fp8.encode(x)


@pytest.mark.parametrize("saturate", ["False", 0, 1, None])
def test_fp8_saturate_must_be_bool(saturate):
    with pytest.raises(TypeError, match="saturate"):
        quantrs.fp8.encode(np.ones(3, np.float32), saturate=saturate)


def test_int4_codes_must_be_uint8():
    w = quantrs.QuantizedWeight.quantize(RNG.standard_normal((64, 3)).astype(np.float32))
    with pytest.raises(TypeError, match="data.*uint8.*int32"):
        quantrs.QuantizedWeight(np.full(96, 289, np.int32), w.scales, 64, 3, 2)


@pytest.mark.parametrize("which", ["data", "scales"])
def test_int4_buffers_shape_checked(which):
    w = quantrs.QuantizedWeight.quantize(RNG.standard_normal((64, 3)).astype(np.float32))
    parts = {"data": w.data, "scales": w.scales}
    parts[which] = parts[which].reshape(1, 1, -1)
    with pytest.raises(quantrs.DimensionMismatch, match=which):
        quantrs.QuantizedWeight(parts["data"], parts["scales"], 64, 3, 2)
    flat = quantrs.QuantizedWeight(w.data.ravel(), w.scales.ravel(), 64, 3, 2)
    assert flat == quantrs.QuantizedWeight(w.data, w.scales, 64, 3, 2) == w


# Shapes, not sizes (docs/errors.md, "Shapes"): a bias is (out,) -- (E, out) for
# stacked experts -- and nothing else of the same size.
SHAPES_RNG = np.random.default_rng(16)  # not RNG: the draws of the other tests stay as they were
W16 = SHAPES_RNG.standard_normal((16, 64)).astype(np.float32)


def _shaped_calls(bad):
    """(label, call with the badly shaped array, argument, expected shape)."""
    fp8 = quantrs.PerTensorFP8Linear.from_float(W16)
    qw = quantrs.QuantizedWeight.quantize(W16.T.copy())
    q8 = quantrs.Int8Linear.from_float(W16)
    return [
        ("UnquantLinear", lambda: quantrs.UnquantLinear(W16, bad(16)), "bias", [16]),
        (
            "Int8Linear.from_float",
            lambda: quantrs.Int8Linear.from_float(W16, bad(16)),
            "bias",
            [16],
        ),
        ("Int8Linear", lambda: quantrs.Int8Linear(q8.q, q8.scales, bad(16)), "bias", [16]),
        ("Int4Linear", lambda: quantrs.Int4Linear(qw, bad(16)), "bias", [16]),
        (
            "Int4Linear.from_float",
            lambda: quantrs.Int4Linear.from_float(W16, bad(16)),
            "bias",
            [16],
        ),
        (
            "PerTensorFP8Linear.from_float",
            lambda: quantrs.PerTensorFP8Linear.from_float(W16, bad(16)),
            "bias",
            [16],
        ),
        (
            "PerTensorFP8Linear",
            lambda: quantrs.PerTensorFP8Linear(fp8.weight, 1.0, bias=bad(16)),
            "bias",
            [16],
        ),
        ("serialize_with_bias", lambda: fp8.serialize_with_bias(bad(16)), "bias", [16]),
        (
            "Int4Linear.from_float imatrix",
            lambda: quantrs.Int4Linear.from_float(W16, imatrix_weight=bad(64)),
            "imatrix_weight",
            [64],
        ),
        (
            "apply_isq imatrix",
            lambda: fp8.apply_isq("int4", imatrix_weight=bad(64)),
            "imatrix_weight",
            [64],
        ),
    ]


@pytest.mark.parametrize("make", [(1, 1, -1), (1, -1), (-1, 1)], ids=str)
@pytest.mark.parametrize("i", range(10))
def test_vector_arguments_are_shape_checked(i, make):
    def bad(n):
        return np.ones(n, np.float32).reshape(make)

    label, call, arg, expected = _shaped_calls(bad)[i]
    got = list(bad(expected[0]).shape)
    with pytest.raises(quantrs.DimensionMismatch) as info:
        call()
    assert f"{arg}: expected {expected}, got {got}" in str(info.value), label
    # the same call with the documented shape works
    label, call, _, _ = _shaped_calls(lambda n: np.ones(n, np.float32))[i]
    call()


def test_int8_scales_flat_or_a_column():
    q8 = quantrs.Int8Linear.from_float(W16)
    flat = quantrs.Int8Linear(q8.q, q8.scales)
    column = quantrs.Int8Linear(q8.q, q8.scales.reshape(16, 1))  # compressed-tensors' layout
    np.testing.assert_array_equal(flat.dequantize_w(), column.dequantize_w())
    for shape in [(1, 16), (1, 1, 16), (2, 8)]:
        with pytest.raises(
            quantrs.DimensionMismatch, match=r"scales: expected \[16\] or \[16, 1\]"
        ):
            quantrs.Int8Linear(q8.q, q8.scales.reshape(shape))


def test_stacked_expert_bias_is_two_dimensional():
    w = SHAPES_RNG.standard_normal((3, 16, 64)).astype(np.float32)
    b = SHAPES_RNG.standard_normal((3, 16)).astype(np.float32)
    layer = quantrs.PerTensorFP8Linear.from_float(w, b)
    np.testing.assert_array_equal(layer.bias, b)
    with pytest.raises(quantrs.DimensionMismatch, match=r"bias: expected \[3, 16\], got \[48\]"):
        quantrs.PerTensorFP8Linear.from_float(w, b.ravel())


def test_int4_quantize_flat_w_or_exact_shape():
    w = SHAPES_RNG.standard_normal((64, 3)).astype(np.float32)
    flat = quantrs.QuantizedWeight.quantize(w.ravel(), 64, 3)
    assert flat == quantrs.QuantizedWeight.quantize(w)
    with pytest.raises(quantrs.DimensionMismatch, match=r"w: expected \[64, 3\], got \[1, 64, 3\]"):
        quantrs.QuantizedWeight.quantize(w[None], 64, 3)


# --- INT4 range (item 5) -----------------------------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_int4_huge_x_stays_finite(batch):
    w_f = (RNG.standard_normal((64, 5)) * 1e-3).astype(np.float32)
    w = quantrs.QuantizedWeight.quantize(w_f)
    x = RNG.standard_normal((batch, 64)).astype(np.float32)
    x[:, 3] = 3e38
    x[0, 10] = -2e38
    ref = x.astype(np.float64) @ w.dequantize().astype(np.float64)
    assert np.all(np.isfinite(ref))
    y = w.matvec(x[0]) if batch == 1 else w.matmul(x)
    y = np.atleast_2d(y)
    assert np.all(np.isfinite(y))
    # float32 summation error bound, relative to sum |x_i w_ij| rather than to the result:
    # the huge terms may cancel, so a bound relative to |ref| would depend on the draw.
    mag = np.abs(x[: y.shape[0]].astype(np.float64)) @ np.abs(w.dequantize().astype(np.float64))
    assert np.all(np.abs(y - ref[: y.shape[0]]) <= 64 * 2.0**-24 * mag)


@pytest.mark.kernel
@pytest.mark.parametrize("cls", ["PerTensorFP8Linear", "Int8Linear"])
@pytest.mark.parametrize("batch", [1, 8])
def test_linear_huge_x_stays_finite(cls, batch):
    w = (RNG.standard_normal((5, 64)) * 1e-3).astype(np.float32)
    bias = RNG.standard_normal(5).astype(np.float32)
    layer = getattr(quantrs, cls).from_float(w, bias)
    x = RNG.standard_normal((batch, 64)).astype(np.float32)
    x[:, 3] = 3e38
    ref = x.astype(np.float64) @ layer.dequantize_w().astype(np.float64).T + bias
    assert np.all(np.isfinite(ref))
    y = layer.forward(x)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=0)


# --- determinism (item 11) ---------------------------------------------------


def test_int4_bytes_are_deterministic(tmp_path):
    w = quantrs.QuantizedWeight.quantize(RNG.standard_normal((64, 3)).astype(np.float32))
    assert len({w.to_bytes() for _ in range(20)}) == 1
    assert len({pickle.dumps(w) for _ in range(20)}) == 1
    w.save(tmp_path / "a.st")
    w.save(tmp_path / "b.st")
    assert (tmp_path / "a.st").read_bytes() == (tmp_path / "b.st").read_bytes()
    assert quantrs.QuantizedWeight.from_bytes(w.to_bytes()) == w


# --- atomic writes (item 7) --------------------------------------------------


def temps(d):
    return [p for p in os.listdir(d) if "quantrs-tmp" in p]


def test_threads_saving_to_one_path(tmp_path):
    opt = trained()
    path = tmp_path / "s.st"
    errors = []

    def save():
        try:
            for _ in range(5):
                opt.save_state(path)
        except Exception as e:  # noqa: BLE001 (collected and asserted below)
            errors.append(e)

    ts = [threading.Thread(target=save) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []
    assert temps(tmp_path) == []
    quantrs.AdamW4bit(1e-3).load_state(path)


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path):
    path = tmp_path / "s.st"
    code = (
        "import os, quantrs, numpy as np\n"
        "o = quantrs.AdamW4bit(1e-3)\n"
        f"o.save_state({str(path)!r})\n"
        # leave a temporary as a kill -9 between write and rename would
        f"t = {str(tmp_path)!r} + '/.s.st.quantrs-tmp.%d.0' % os.getpid()\n"
        "open(t, 'wb').write(b'x' * 1000)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert len(temps(tmp_path)) == 1
    trained().save_state(path)
    assert temps(tmp_path) == []


def test_refuses_fifo_and_directory(tmp_path):
    opt = trained()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="fifo.*not a regular file"):
        opt.save_state(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(OSError, match="not a regular file"):
        opt.save_state(tmp_path)


def test_symlink_target_is_replaced_and_mode_kept(tmp_path):
    real = tmp_path / "real.st"
    real.write_bytes(b"old")
    os.chmod(real, 0o600)
    link = tmp_path / "link.st"
    link.symlink_to("real.st")
    w = quantrs.QuantizedWeight.quantize(RNG.standard_normal((64, 3)).astype(np.float32))
    w.save(link)
    assert link.is_symlink()
    assert quantrs.QuantizedWeight.load(real) == w
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o600


def test_new_file_honours_umask(tmp_path):
    old = os.umask(0o027)
    try:
        trained().save_state(tmp_path / "n.st")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "n.st").st_mode) == 0o640


def test_oserror_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "x.st"
    with pytest.raises(FileNotFoundError, match="nope"):
        quantrs.AdamW4bit(1e-3).load_state(missing)
    with pytest.raises(FileNotFoundError, match="nope"):
        quantrs.QuantizedWeight.load(missing)
    with pytest.raises(FileNotFoundError, match="nope"):
        trained().save_state(missing)


# --- the table ----------------------------------------------------------------

W64 = RNG.standard_normal((64, 3)).astype(np.float32)
QW = quantrs.QuantizedWeight.quantize(W64)


def _calls():
    """(label, callable, exception class, text the message must contain)."""
    ro = np.ones((64, 3), np.float32)
    ro.flags.writeable = False
    f_order = np.asfortranarray(np.ones((64, 3), np.float32))
    neg = np.ones((64, 3), np.float32)[::-1]
    opt = quantrs.AdamW4bit(1e-3)
    p = np.ones(8, np.float32)
    iv, ty = quantrs.InvalidArgument, TypeError
    cases = [
        (
            "quantize group_size=-2",
            lambda: quantrs.QuantizedWeight.quantize(W64, group_size=-2),
            iv,
            "group_size",
        ),
        (
            "quantize group_size=2**70",
            lambda: quantrs.QuantizedWeight.quantize(W64, group_size=2**70),
            iv,
            "group_size",
        ),
        (
            "quantize group_size=1.5",
            lambda: quantrs.QuantizedWeight.quantize(W64, group_size=1.5),
            ty,
            "group_size",
        ),
        (
            "quantize group_size='32'",
            lambda: quantrs.QuantizedWeight.quantize(W64, group_size="32"),
            ty,
            "group_size",
        ),
        (
            "quantize in_feat=-1",
            lambda: quantrs.QuantizedWeight.quantize(W64.ravel(), -1, 3),
            iv,
            "in_feat",
        ),
        (
            "quantize out_feat=2**64",
            lambda: quantrs.QuantizedWeight.quantize(W64.ravel(), 64, 2**64),
            iv,
            "out_feat",
        ),
        ("quantize w=None", lambda: quantrs.QuantizedWeight.quantize(None), ty, "w"),
        ("quantize w=str", lambda: quantrs.QuantizedWeight.quantize("abc"), ty, "w"),
        (
            "QuantizedWeight num_groups=-1",
            lambda: quantrs.QuantizedWeight(QW.data, QW.scales, 64, 3, -1),
            iv,
            "num_groups",
        ),
        (
            "QuantizedWeight in_feat=1.0",
            lambda: quantrs.QuantizedWeight(QW.data, QW.scales, 64.0, 3, 2),
            ty,
            "in_feat",
        ),
        (
            "QuantizedWeight data float",
            lambda: quantrs.QuantizedWeight(QW.data.astype(np.float32), QW.scales, 64, 3, 2),
            ty,
            "data",
        ),
        ("matvec x 0-d", lambda: QW.matvec(np.float32(1)), quantrs.DimensionMismatch, "x"),
        (
            "matvec x empty",
            lambda: QW.matvec(np.zeros(0, np.float32)),
            quantrs.DimensionMismatch,
            "x",
        ),
        ("matvec x object", lambda: QW.matvec(np.array([None] * 64)), ty, "x"),
        ("dequantize_to read-only", lambda: QW.dequantize_to(ro), iv, "out"),
        ("dequantize_to Fortran", lambda: QW.dequantize_to(f_order), iv, "out"),
        ("dequantize_to negative strides", lambda: QW.dequantize_to(neg), iv, "out"),
        ("dequantize_to float64", lambda: QW.dequantize_to(np.zeros((64, 3))), ty, "out"),
        ("Rng.random(-1)", lambda: quantrs.Rng(1).random(-1), iv, "n"),
        ("Rng.random(2.0)", lambda: quantrs.Rng(1).random(2.0), ty, "n"),
        (
            "AdvancedQuantizationConfig block_size=-1",
            lambda: quantrs.AdvancedQuantizationConfig(block_size=-1),
            iv,
            "block_size",
        ),
        (
            "AdvancedQuantizationConfig block_size=2**64",
            lambda: quantrs.AdvancedQuantizationConfig(block_size=2**64),
            iv,
            "block_size",
        ),
        (
            "AdvancedQuantizationConfig method='nf5'",
            lambda: quantrs.AdvancedQuantizationConfig(method="nf5"),
            iv,
            "method",
        ),
        (
            "apply_accumulated_grads(-1)",
            lambda: opt.apply_accumulated_grads(-1),
            iv,
            "accumulation_steps",
        ),
        (
            "apply_accumulated_grads(0.5)",
            lambda: opt.apply_accumulated_grads(0.5),
            ty,
            "accumulation_steps",
        ),
        ("update param read-only", lambda: opt.update(ro, ro), iv, "param"),
        ("update param is grad", lambda: opt.update(p, p), iv, "param"),
        (
            "update grad NaN",
            lambda: opt.update(np.ones(3, np.float32), np.array([1, np.nan, 0], np.float32)),
            iv,
            "grad",
        ),
        ("QuantParams qmin=-2**40", lambda: quantrs.QuantParams(0.1, 0, -(2**40), 127), iv, "qmin"),
        ("QuantParams qmax=2**31", lambda: quantrs.QuantParams(0.1, 0, -128, 2**31), iv, "qmax"),
        (
            "QuantParams zero_point=0.5",
            lambda: quantrs.QuantParams(0.1, 0.5, -128, 127),
            ty,
            "zero_point",
        ),
        ("calibrate axis=-1", lambda: qat.calibrate(np.ones((4, 4)), axis=-1), iv, "axis"),
        ("calibrate axis=2**64", lambda: qat.calibrate(np.ones((4, 4)), axis=2**64), iv, "axis"),
        (
            "calibrate target='int3'",
            lambda: qat.calibrate(np.ones((4, 4)), target="int3"),
            ValueError,
            "target",
        ),
        (
            "fp8 encode fmt='e3m4'",
            lambda: quantrs.fp8.encode(np.ones(2, np.float32), fmt="e3m4"),
            ValueError,
            "fmt",
        ),
        ("fp8 decode int32 codes", lambda: quantrs.fp8.decode(np.ones(2, np.int32)), ty, "codes"),
        ("deserialize int", lambda: quantrs.PerTensorFP8Linear.deserialize(10**9), ty, "data"),
        (
            "from_bytes garbage",
            lambda: quantrs.QuantizedWeight.from_bytes(b"\x00" * 16),
            quantrs.SerializationError,
            "safetensors",
        ),
    ]
    return cases


CASES = _calls()


@pytest.mark.parametrize("label,call,exc,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_table(label, call, exc, needle):
    with pytest.raises(exc) as info:
        call()
    assert needle in str(info.value), f"{label}: {info.value}"
    assert not isinstance(info.value, OverflowError), label
