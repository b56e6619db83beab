"""Every error the Python package raises is a ``quantrs.QuantError`` (docs/errors.md), or the
``TypeError`` / ``OSError`` / ``ImportError`` Python code expects, and names what was wrong.

Two checks: a scan of every ``raise`` statement of ``python/quantrs`` (a raise site changed
back to a bare ``ValueError`` fails it), and a table that drives the public raise sites with
bad input and checks the class and the message."""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import quantrs
import quantrs.cli._convert
import quantrs.cli._folder
import quantrs.cli._import
import quantrs.cli._inspect
import quantrs.cli._quantize
import quantrs.formats as qf
from quantrs import _core
from quantrs.cli._errors import CliError
from quantrs.formats._stfile import StFormatError

PKG = Path(quantrs.__file__).parent
# Owned by the GPU bindings (device-only raise sites, tested by test_gpu*.py).
SKIP_FILES = {"cuda.py", "torch/_cuda.py"}

# Raise sites that are deliberately not QuantErrors: (file, text in the raise statement).
NOT_QUANT_ERRORS = {
    # abstract methods of SlotOptimizer
    ("torch/_base.py", "NotImplementedError"),
    # broken invariants of the writer (a bug in quantrs, never the user's input)
    ("formats/_stfile.py", "internal error"),
    ("formats/_declared_writer.py", "internal error"),
    ("formats/gguf_rewrite.py", "internal error"),
    ("cli/_convert.py", "internal error"),
    ("cli/_import.py", "internal error"),
    # a bench script's failure, reported per suite by run_benches, never raised to the user
    ("cli/_bench.py", "exit status"),
    ("cli/_bench.py", "has no 'bench' name"),
    ("cli/_bench.py", "printed no JSON list"),
    # argparse turns it into its usage error
    ("cli/__init__.py", "ArgumentTypeError"),
}
# What Python code expects outside the hierarchy (docs/errors.md, "Outside the hierarchy").
PYTHON_KINDS = (TypeError, OSError, ImportError)


def _exception_classes() -> dict[str, type]:
    out = {n: v for n, v in vars(builtins).items() if isinstance(v, type)}
    for ns in (vars(_core), vars(quantrs), vars(qf)):
        out.update({n: v for n, v in ns.items() if isinstance(v, type)})
    out.update(CliError=CliError, StFormatError=StFormatError)
    out["ArgumentTypeError"] = argparse.ArgumentTypeError
    return out


def _raise_sites():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in SKIP_FILES:
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                yield rel, node, ast.get_source_segment(text, node) or ""


def _raised_name(exc: ast.expr) -> str | None:
    """The class name of ``raise X(...)`` / ``raise mod.X(...)``; None for a re-raise of a
    caught exception (``raise e``, ``raise type(e)(...)``: the class is the original's)."""
    target = exc.func if isinstance(exc, ast.Call) else exc
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name) and target.id[:1].isupper():
        return target.id
    return None


def test_every_raise_site_raises_a_quant_error():
    classes = _exception_classes()
    bad, count = [], 0
    for rel, node, src in _raise_sites():
        name = _raised_name(node.exc)
        if name is None:
            continue
        count += 1
        if any(rel == f and needle in src for f, needle in NOT_QUANT_ERRORS):
            continue
        cls = classes.get(name)
        if cls is None:
            bad.append(f"{rel}:{node.lineno}: unknown class {name}")
        elif not issubclass(cls, (quantrs.QuantError, *PYTHON_KINDS)):
            bad.append(f"{rel}:{node.lineno}: raises {name}, not a quantrs.QuantError")
    assert count > 150, count  # the scan sees the package
    assert bad == [], "\n".join(bad)


def test_exceptions_named_as_not_quant_errors_still_exist():
    """Each exemption above matches a raise site, so a stale one cannot hide a new site."""
    sites = list(_raise_sites())
    for f, needle in NOT_QUANT_ERRORS:
        assert any(rel == f and needle in src for rel, _, src in sites), (f, needle)


# --- the classes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,bases",
    [
        (qf.FormatError, (quantrs.QuantError, ValueError)),
        (qf.CorruptCheckpointError, (qf.FormatError, quantrs.SerializationError, ValueError)),
        (
            qf.UnsupportedFormatError,
            (qf.FormatError, quantrs.UnsupportedOperation, NotImplementedError, ValueError),
        ),
        (qf.TensorNotFoundError, (qf.FormatError, quantrs.InvalidArgument, KeyError)),
        (StFormatError, (qf.CorruptCheckpointError,)),
        (CliError, (quantrs.QuantError,)),
    ],
)
def test_class_hierarchy(cls, bases):
    for b in bases:
        assert issubclass(cls, b), (cls, b)


def test_tensor_not_found_message_is_not_quoted_like_a_key_error():
    assert str(qf.TensorNotFoundError("f.st: no tensor 'w'")) == "f.st: no tensor 'w'"


# --- the table ----------------------------------------------------------------------------


def _st(path: Path, tensors: dict, metadata=None) -> Path:
    save_file(tensors, str(path), metadata=metadata)
    return path


def _folder(path: Path, config: dict, tensors: dict) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    _st(path / "model.safetensors", tensors)
    return path


def _gptq(tmp: Path, bits=4, **quant) -> Path:
    i32 = np.zeros((8, 16), np.int32)
    tensors = {
        "l.qweight": i32,
        "l.qzeros": np.zeros((1, 16 * bits // 32), np.int32),
        "l.scales": np.ones((1, 16), np.float16),
    }
    cfg = {"quantization_config": {"quant_method": "gptq", "bits": bits, **quant}}
    return _folder(tmp / "gptq", cfg, tensors)


def _awq(tmp: Path, **quant) -> Path:
    tensors = {
        "l.qweight": np.zeros((64, 2), np.int32),
        "l.qzeros": np.zeros((1, 2), np.int32),
        "l.scales": np.ones((1, 16), np.float16),
    }
    return _folder(tmp / "awq", {"quantization_config": {"quant_method": "awq", **quant}}, tensors)


def _gguf(tmp: Path, version=3) -> Path:
    # header: magic, version, no tensors, no keys
    p = tmp / "x.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, 0) + b"\0" * 8)
    return p


def _fp8_per_channel(tmp: Path) -> Path:
    """An FP8 layer with per-channel scales (safetensors.numpy cannot write F8_E4M3)."""
    tensors = {
        "l.weight": ("F8_E4M3", [4, 8], bytes(32)),
        "l.weight_scale": ("F32", [4, 1], np.ones(4, np.float32).tobytes()),
    }
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path = tmp / "fp8.safetensors"
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def _with_ck(path: Path, use):
    with qf.Checkpoint(path) as ck:
        return use(ck)


def _bad_config(tmp: Path) -> Path:
    folder = tmp / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{")
    _st(folder / "model.safetensors", {"w": np.ones(2, np.float32)})
    return folder


def _bad_bytes(tmp: Path) -> Path:
    p = tmp / "bad.safetensors"
    p.write_bytes(struct.pack("<Q", 2) + b"[]")
    return p


def _cases():
    """(id, function of tmp_path that raises, expected class, text the message names)."""
    q = quantrs
    w = np.ones((4, 64), np.float32)
    qw = q.QuantizedWeight.quantize(np.ones((64, 16), np.float32), group_size=16, method="rtn")
    cases = [
        # quantrs.formats
        (
            "checkpoint-corrupt",
            lambda t: qf.Checkpoint(_bad_bytes(t)),
            qf.CorruptCheckpointError,
            "bad.safetensors",
        ),
        ("checkpoint-missing", lambda t: qf.Checkpoint(t / "nope"), FileNotFoundError, "nope"),
        (
            "checkpoint-no-tensor",
            lambda t: _with_ck(_st(t / "a.st", {"w": w}), lambda ck: ck.info("v")),
            qf.TensorNotFoundError,
            "'v'",
        ),
        (
            "checkpoint-dtype",
            lambda t: _with_ck(
                _st(t / "a.st", {"w": w.astype(np.int32)}), lambda ck: ck.float32("w")
            ),
            qf.CorruptCheckpointError,
            "'w'",
        ),
        (
            "checkpoint-config-json",
            lambda t: _with_ck(_bad_config(t), lambda ck: ck.quant_settings()),
            qf.CorruptCheckpointError,
            "config.json",
        ),
        (
            "gptq-bits",
            lambda t: qf.load_gptq(_gptq(t, bits=3), "l"),
            qf.UnsupportedFormatError,
            "3-bit",
        ),
        (
            "gptq-format",
            lambda t: qf.load_gptq(_gptq(t, checkpoint_format="marlin"), "l"),
            qf.UnsupportedFormatError,
            "marlin",
        ),
        (
            "gptq-prefix",
            lambda t: qf.load_gptq(_gptq(t), "nope"),
            qf.TensorNotFoundError,
            "'nope.qweight'",
        ),
        (
            "awq-version",
            lambda t: qf.load_awq(_awq(t, version="gemv"), "l"),
            qf.UnsupportedFormatError,
            "'gemv'",
        ),
        (
            "awq-bits",
            lambda t: qf.load_awq(_awq(t, bits=8), "l"),
            qf.UnsupportedFormatError,
            "8-bit",
        ),
        ("awq-method", lambda t: qf.load_awq(_gptq(t), "l"), qf.UnsupportedFormatError, "'gptq'"),
        (
            "gguf-version",
            lambda t: qf.GgufFile(_gguf(t, version=2)),
            qf.UnsupportedFormatError,
            "version 2",
        ),
        (
            "gguf-magic",
            lambda t: (
                qf.GgufFile(t / "x.gguf")
                if (t / "x.gguf").write_bytes(b"GGUX" + b"\0" * 40)
                else None
            ),
            qf.CorruptCheckpointError,
            "magic",
        ),
        ("gguf-no-tensor", lambda t: qf.load_gguf(_gguf(t), "w"), qf.TensorNotFoundError, "'w'"),
        (
            "gguf-write-group",
            lambda t: qf.save_gguf(t / "o.gguf", {"w": qw}),
            qf.UnsupportedFormatError,
            "'w'",
        ),
        (
            "gguf-write-name",
            lambda t: qf.save_gguf(t / "o.gguf", {"": qw}),
            qf.UnsupportedFormatError,
            "tensor name",
        ),
        (
            "fp8-per-channel",
            lambda t: qf.load_fp8(_fp8_per_channel(t), "l"),
            qf.UnsupportedFormatError,
            "'l'",
        ),
        (
            "fp8-dtype",
            lambda t: qf.load_fp8(_st(t / "a.st", {"l.weight": w}), "l"),
            qf.CorruptCheckpointError,
            "'l.weight'",
        ),
        # quantrs.cli
        (
            "cli-load-int4",
            lambda t: quantrs.cli.load_int4(_st(t / "a.st", {"w": w}), "w"),
            qf.TensorNotFoundError,
            "'w'",
        ),
        (
            "cli-quantize-options",
            lambda t: quantrs.cli._quantize.check_options("int3", 32, "x"),
            CliError,
            "--format",
        ),
        (
            "cli-quantize-same",
            lambda t: quantrs.cli._quantize.quantize_file(
                _st(t / "a.st", {"w": w}), t / "a.st", "int4", 32, False
            ),
            CliError,
            "OUT",
        ),
        (
            "cli-convert-source",
            lambda t: quantrs.cli._import.convert(
                _st(t / "a.st", {"w": w}), t / "b.st", "exl2", False, progress=False
            ),
            CliError,
            "--from",
        ),
        (
            "cli-inspect-corrupt",
            lambda t: quantrs.cli._inspect.inspect_path(_bad_bytes(t)),
            CliError,
            "bad.safetensors",
        ),
        (
            "cli-folder-out",
            lambda t: quantrs.cli._folder.quantize_folder(
                _folder(t / "m", {}, {"w": w}),
                t / "m" / "out",
                "int4",
                32,
                progress=False,
            ),
            CliError,
            "OUT",
        ),
        (
            "cli-fp8-non-finite",
            lambda t: quantrs.cli._convert.fp8_quantize(
                quantrs.fp8, np.array([[np.nan]], np.float32)
            ),
            q.InvalidArgument,
            "w:",
        ),
        # quantrs.fp8
        (
            "fp8-fmt",
            lambda t: q.fp8.encode(np.ones(2, np.float32), fmt="e3m4"),
            q.InvalidArgument,
            "fmt",
        ),
        ("fp8-fmt-type", lambda t: q.fp8.encode(np.ones(2, np.float32), fmt=3), TypeError, "fmt"),
        ("fp8-codes-dtype", lambda t: q.fp8.decode(np.ones(2, np.int16)), TypeError, "codes"),
        # quantrs.reference
        (
            "reference-in-feat",
            lambda t: q.reference.quantize_int4(np.ones((0, 2), np.float32)),
            q.InvalidArgument,
            "in_feat",
        ),
        (
            "reference-w-shape",
            lambda t: q.reference.quantize_int4(np.ones(4, np.float32)),
            q.InvalidArgument,
            "w:",
        ),
        (
            "reference-pack",
            lambda t: q.reference.pack_int4(np.ones((3, 2), np.int8)),
            q.InvalidArgument,
            "q:",
        ),
        (
            "reference-vmap",
            lambda t: q.reference.optim.variance_table("cubic"),
            q.InvalidArgument,
            "name",
        ),
        (
            "reference-qat",
            lambda t: q.reference.qat.qparams_minmax(0.0, 0.0),
            q.InvalidArgument,
            "lo, hi",
        ),
    ]
    return cases


def _torch_cases():
    torch = pytest.importorskip("torch")
    import quantrs.torch as qt

    def p():
        return torch.nn.Parameter(torch.ones(8))

    def bad_load(t):
        opt = qt.AdamW4bit([p()])
        state = opt.state_dict()
        state["param_groups"] = state["param_groups"] * 2
        opt.load_state_dict(state)

    def grad_nan(t):
        w = p()
        w.grad = torch.full((8,), float("nan"))
        qt.AdamW4bit([w]).step()

    def param_dtype(t):
        w = torch.nn.Parameter(torch.ones(8).double())
        w.grad = torch.ones(8).double()
        qt.AdamW4bit([w]).step()

    def qat_target(t):
        qt.QatAdamW([p()], target="int3")

    def qat_change(t):
        w = p()
        opt = qt.QatAdamW([w])
        w.grad = torch.ones(8)
        opt.step()
        opt.param_groups[0]["target"] = "int4"
        opt.step()

    lin = torch.nn.Linear(64, 8)
    return [
        ("torch-lr", lambda t: qt.AdamW4bit([p()], lr=-1.0), quantrs.InvalidArgument, "'lr'"),
        (
            "torch-betas",
            lambda t: qt.AdamW4bit([p()], betas=(0.9,)),
            quantrs.InvalidArgument,
            "'betas'",
        ),
        ("torch-eps", lambda t: qt.Adam4bit([p()], eps=0.0), quantrs.InvalidArgument, "'eps'"),
        (
            "torch-param-dtype",
            param_dtype,
            TypeError,
            "dtype",
        ),
        ("torch-grad-nan", grad_nan, quantrs.InvalidArgument, "grad"),
        ("torch-load-groups", bad_load, quantrs.InvalidArgument, "state_dict"),
        ("torch-qat-target", qat_target, quantrs.InvalidArgument, "'target'"),
        ("torch-qat-change", qat_change, quantrs.InvalidState, "cannot change"),
        (
            "torch-quantize-method",
            lambda t: qt.quantize_(torch.nn.Sequential(lin), "int3"),
            quantrs.InvalidArgument,
            "method",
        ),
        (
            "torch-quantize-layer",
            lambda t: qt.quantize_(lin, "int4"),
            quantrs.InvalidArgument,
            "nn.Linear",
        ),
        (
            "torch-int4-input",
            lambda t: qt.Int4Linear.from_linear(lin)(torch.ones(3, 7)),
            quantrs.InvalidArgument,
            "64",
        ),
        (
            "torch-from-linear",
            lambda t: qt.Int4Linear.from_linear(torch.nn.ReLU()),
            TypeError,
            "nn.Linear",
        ),
    ]


def _check(tmp_path, fn, cls, needle):
    with pytest.raises(cls) as info:
        fn(tmp_path)
    e = info.value
    assert isinstance(e, (quantrs.QuantError, *PYTHON_KINDS)), type(e)
    assert needle in str(e), str(e)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_public_raise_sites(tmp_path, case):
    _check(tmp_path, *case[1:])


@pytest.mark.parametrize("index", range(12))
def test_torch_raise_sites(tmp_path, index):
    cases = _torch_cases()
    assert len(cases) == 12
    _check(tmp_path, *cases[index][1:])
