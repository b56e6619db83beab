"""Wrong Python types for every scalar argument of the bindings (docs/errors.md).

The arguments are read from ``quantrs/_core.pyi`` (the stub stubtest holds
true to the module): every public function and method, every parameter
annotated ``int``, ``float``, ``bool``, ``str``, an enum (``str |
QuantTarget``), a path, bytes, a shape or an ``rng``. ``valid_calls`` gives one
valid call per callable; each scalar argument in turn is replaced by values
of the wrong type (float for int, str for float, None where None is not
accepted, a list, ...) and the call must raise ``TypeError`` whose message
names the argument, says what it expected and names the type it got
(``lr: expected float, got str``). A callable with scalar arguments that
``valid_calls`` does not cover fails ``test_every_scalar_argument_is_covered``.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import quantrs
from quantrs import _core

STUB = Path(quantrs.__file__).with_name("_core.pyi")

# GPU entry points belong to the CUDA bindings (tests/python/test_gpu*.py).
GPU = {"DeviceArray"}
ENUMS = {"QuantTarget", "QuantScheme", "RoundingMode", "QuantizationMethod", "QatConfig"}


def kind_of(annotation: str) -> tuple[str | None, bool]:
    """(kind, None accepted) of a stub annotation; kind None: not a scalar."""
    parts = {p.strip() for p in annotation.split("|")}
    optional = "None" in parts
    parts -= {"None"}
    if parts in ({"int"}, {"float"}, {"bool"}, {"str"}):
        return parts.pop(), optional
    if "str" in parts and parts - {"str"} <= ENUMS:
        return "enum", optional
    if parts == {"str", "os.PathLike[str]"}:
        return "path", optional
    if parts in ({"bytes"}, {"bytes", "bytearray", "memoryview"}):
        return "bytes", optional
    if parts == {"int", "Rng"}:
        return "rng", optional
    if parts == {"RngLike"}:  # quantrs.qat's alias: int | Rng | None
        return "rng", True
    if parts == {"list[int]", "tuple[int, ...]"}:
        return "shape", optional
    return None, optional


def stub_scalars() -> dict[str, list[tuple[str, str, bool]]]:
    """{"Class.method" / "function": [(argument, kind, None accepted)]}."""
    tree = ast.parse(STUB.read_text())
    out: dict[str, list[tuple[str, str, bool]]] = {}

    def add(qual: str, fn: ast.FunctionDef) -> None:
        a = fn.args
        params = []
        for p in a.posonlyargs + a.args + a.kwonlyargs:
            if p.arg in ("self", "cls") or p.annotation is None:
                continue
            kind, optional = kind_of(ast.unparse(p.annotation))
            if kind is not None:
                params.append((p.arg, kind, optional))
        if params:
            out[qual] = params

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_cuda"):
            if not node.name.startswith("cuda"):
                add(node.name, node)
        elif isinstance(node, ast.ClassDef) and node.name not in GPU:
            for f in node.body:
                if not isinstance(f, ast.FunctionDef):
                    continue
                decorators = [ast.unparse(d) for d in f.decorator_list]
                if "property" in decorators:
                    continue
                if any(d.endswith(".setter") for d in decorators):
                    add(f"{node.name}.{f.name}=", f)
                elif f.name in ("__new__", "__setstate__") or not f.name.startswith("_"):
                    add(f"{node.name}.{f.name}", f)
    return out


# --- one valid call per callable ---------------------------------------------

RNG = np.random.default_rng(3)
W = RNG.standard_normal((4, 64)).astype(np.float32)
QW = quantrs.QuantizedWeight.quantize(W.T.copy())
X = RNG.standard_normal((4, 8))


def layers():
    return {
        "PerTensorFP8Linear": quantrs.PerTensorFP8Linear.from_float(W),
        "UnquantLinear": quantrs.UnquantLinear(W),
        "Int8Linear": quantrs.Int8Linear.from_float(W),
        "Int4Linear": quantrs.Int4Linear.from_float(W),
    }


def opt_with_param():
    opt = quantrs.AdamW4bit(1e-3)
    p = np.ones(8, np.float32)
    return opt, p


def setter(obj, attr):
    def call(**kw):
        ((_, value),) = kw.items()
        setattr(obj, attr, value)

    return call


def positional(fn, order):
    return lambda **kw: fn(*(kw[k] for k in order))


def valid_calls(tmp: Path):
    """{stub name: [(label, callable, valid keyword arguments)]}."""
    path = str(tmp / "x.st")
    QW.save(path)
    fp8 = quantrs.PerTensorFP8Linear.from_float(W)
    st = tmp / "fp8.safetensors"
    _write_fp8(st, fp8)
    qat_opt = quantrs.QatOptimizer(np.ones(8), "int8", rng=1)
    params = quantrs.QuantParams(0.1, 0, -128, 127)
    opt, p = opt_with_param()
    opt.save_state(tmp / "o.st")
    g = np.ones(8, np.float32)
    stepped, sp = opt_with_param()
    stepped.update(sp, g, name="w")
    exported = stepped.export_param_state("w")
    ls = layers()
    asym = quantrs.Int4AsymWeight.quantize(W.reshape(4, 64), group_size=32)
    calls = {
        "QuantizedWeight.__new__": [
            (
                "QuantizedWeight",
                quantrs.QuantizedWeight,
                dict(data=QW.data, scales=QW.scales, in_feat=64, out_feat=4, num_groups=2),
            )
        ],
        "QuantizedWeight.quantize": [
            (
                "quantize",
                quantrs.QuantizedWeight.quantize,
                dict(w=W.ravel(), in_feat=64, out_feat=4, group_size=32),
            )
        ],
        "QuantizedWeight.save": [("save", QW.save, dict(path=path))],
        "int4_linear": [
            (
                "int4_linear",
                quantrs._core.int4_linear,
                dict(
                    x=np.ones((1, 64), np.float32),
                    data=np.asarray(QW.data),
                    scales=np.asarray(QW.scales),
                    bias=None,
                    in_feat=64,
                    out_feat=4,
                    num_groups=2,
                    activations="float32",
                ),
            )
        ],
        "int4_linear_bf16": [
            (
                "int4_linear_bf16",
                quantrs._core.int4_linear_bf16,
                dict(
                    x=np.ones((1, 64), np.uint16),
                    data=np.asarray(QW.data),
                    scales=np.asarray(QW.scales),
                    bias=None,
                    in_feat=64,
                    out_feat=4,
                    num_groups=2,
                ),
            )
        ],
        "gguf_linear": [
            (
                "gguf_linear",
                quantrs._core.gguf_linear,
                dict(
                    x=np.ones((1, 32), np.float32),
                    data=np.zeros((2, 34), np.uint8),
                    type="q8_0",
                    in_feat=32,
                    bias=None,
                ),
            )
        ],
        "GgufWeight.from_bytes": [
            (
                "from_bytes",
                quantrs.GgufWeight.from_bytes,
                dict(type="q8_0", shape=(1, 32), buffer=np.zeros(34, np.uint8)),
            )
        ],
        "GgufWeight.quantize": [
            (
                "quantize",
                quantrs.GgufWeight.quantize,
                dict(w=np.ones((1, 32), np.float32), type="q8_0"),
            )
        ],
        "GgufWeight.dequantize_rows": [
            (
                "dequantize_rows",
                quantrs.GgufWeight.from_bytes(
                    "q8_0", (1, 32), np.zeros(34, np.uint8)
                ).dequantize_rows,
                dict(start=0, stop=1),
            )
        ],
        "Int4AsymWeight.dequantize_rows": [
            (
                "dequantize_rows",
                quantrs.Int4AsymWeight.quantize(W.reshape(4, 64), group_size=32).dequantize_rows,
                dict(start=0, stop=4),
            )
        ],
        "Int4AsymWeight.quantize": [
            (
                "quantize",
                quantrs.Int4AsymWeight.quantize,
                dict(w=W.reshape(4, 64), group_size=32, method="rtn"),
            )
        ],
        "Int4AsymWeight.from_parts": [
            (
                "from_parts",
                quantrs.Int4AsymWeight.from_parts,
                dict(codes=asym.codes(), scales=asym.scales(), group_size=32),
            )
        ],
        "Int4KWeight.dequantize_rows": [
            (
                "dequantize_rows",
                quantrs.Int4KWeight.quantize(W.reshape(4, 64)).dequantize_rows,
                dict(start=0, stop=4),
            )
        ],
        "Int4KWeight.quantize": [
            ("quantize", quantrs.Int4KWeight.quantize, dict(w=W.reshape(4, 64), method="rtn"))
        ],
        "IntZpWeight.dequantize_rows": [
            (
                "dequantize_rows",
                quantrs.IntZpWeight.quantize(W.reshape(4, 64), group_size=32).dequantize_rows,
                dict(start=0, stop=4),
            )
        ],
        "IntZpWeight.quantize": [
            (
                "quantize",
                quantrs.IntZpWeight.quantize,
                dict(w=W.reshape(4, 64), group_size=32, bits=8),
            )
        ],
        "IntZpWeight.from_parts": [
            (
                "from_parts",
                quantrs.IntZpWeight.from_parts,
                dict(
                    codes=np.zeros((4, 64), np.uint8),
                    scales=np.ones((4, 2), np.float16),
                    zeros=np.zeros((4, 2), np.uint8),
                    group_size=32,
                    bits=4,
                ),
            )
        ],
        "QuantLinear.__new__": [
            ("QuantLinear", quantrs.QuantLinear, dict(weight=W, format="int8", group_size=32))
        ],
        "_bandwidth_probe": [
            (
                "_bandwidth_probe",
                _core._bandwidth_probe,
                dict(buf=np.ones(1024, np.uint64), kind="read", threads=1),
            )
        ],
        # A valid cap applies at once: put the previous one back.
        "threads.__new__": [("threads", lambda **kw: quantrs.threads(**kw).restore(), dict(n=1))],
        "adam4bit_multi_step": [
            (
                "adam4bit_multi_step",
                _core.adam4bit_multi_step,
                dict(
                    engines=[quantrs.AdamW4bit(1e-3)],
                    params=[np.ones(8, np.float32)],
                    grads=[np.ones(8, np.float32)],
                    name="w",
                ),
            )
        ],
        "QuantizedWeight.load": [("load", quantrs.QuantizedWeight.load, dict(path=path))],
        "_atomic_write": [
            ("_atomic_write", _core._atomic_write, dict(path=str(tmp / "a.bin"), data=b"xy"))
        ],
        "_AtomicFile.__new__": [("_AtomicFile", _core._AtomicFile, dict(path=str(tmp / "b.bin")))],
        "QuantizedWeight.from_bytes": [
            ("from_bytes", quantrs.QuantizedWeight.from_bytes, dict(data=QW.to_bytes()))
        ],
        "fp8_encode": [("fp8_encode", _core.fp8_encode, dict(x=X, fmt="e4m3", saturate=False))],
        "fp8_decode": [
            ("fp8_decode", _core.fp8_decode, dict(codes=np.zeros(3, np.uint8), fmt="e4m3"))
        ],
        "_LinearBase.apply_isq": [
            (f"{n}.apply_isq", layer.apply_isq, dict(dtype="int8", device="cpu", group_size=32))
            for n, layer in ls.items()
        ],
        "_LinearBase.deserialize": [
            (f"{n}.deserialize", type(layer).deserialize, dict(data=layer.serialize()))
            for n, layer in ls.items()
        ],
        "_LinearBase.deserialize_ext_bias": [
            (
                f"{n}.deserialize_ext_bias",
                type(layer).deserialize_ext_bias,
                dict(data=layer.serialize()),
            )
            for n, layer in ls.items()
        ],
        "PerTensorFP8Linear.__new__": [
            (
                "PerTensorFP8Linear",
                quantrs.PerTensorFP8Linear,
                dict(weight=fp8.weight, weight_scale_inv=0.01, activation_scale=1.0),
            )
        ],
        "PerTensorFP8Linear.from_float": [
            (
                "PerTensorFP8Linear.from_float",
                quantrs.PerTensorFP8Linear.from_float,
                dict(w=W, activation_scale=1.0),
            )
        ],
        "PerTensorFP8Linear.from_safetensors": [
            (
                "from_safetensors",
                quantrs.PerTensorFP8Linear.from_safetensors,
                dict(path=str(st), prefix="l"),
            )
        ],
        "Int4Linear.from_float": [
            ("Int4Linear.from_float", quantrs.Int4Linear.from_float, dict(w=W, group_size=32))
        ],
        "QatConfig.__new__": [
            (
                "QatConfig",
                quantrs.QatConfig,
                dict(
                    target="int8",
                    scheme="symmetric",
                    rounding="nearest",
                    lr=1e-3,
                    beta1=0.9,
                    beta2=0.999,
                    eps=1e-8,
                    weight_decay=0.0,
                ),
            )
        ],
        "Rng.__new__": [("Rng", quantrs.Rng, dict(seed=1))],
        "Rng.random": [("Rng.random", quantrs.Rng(1).random, dict(n=3))],
        "Rng.__setstate__": [
            (
                "Rng.__setstate__",
                positional(quantrs.Rng(1).__setstate__, ["counter"]),
                {"counter": 4},
            )
        ],
        "QuantParams.__new__": [
            ("QuantParams", quantrs.QuantParams, dict(scale=0.1, zero_point=0, qmin=-128, qmax=127))
        ],
        "QuantParams.from_absmax": [
            ("from_absmax", quantrs.QuantParams.from_absmax, dict(absmax=1.0, target="int8"))
        ],
        "QuantParams.from_minmax": [
            (
                "from_minmax",
                quantrs.QuantParams.from_minmax,
                dict(min=-1.0, max=1.0, target="int8", scheme="affine"),
            )
        ],
        "QuantParams.calibrate": [
            (
                "QuantParams.calibrate",
                quantrs.QuantParams.calibrate,
                dict(x=X, target="int8", scheme="symmetric", clip_fraction=0.0),
            )
        ],
        "QuantParams.quantize": [
            ("QuantParams.quantize", params.quantize, dict(x=X, rounding="nearest", rng=1))
        ],
        "QuantParams.fake_quant": [
            ("QuantParams.fake_quant", params.fake_quant, dict(x=X, rounding="nearest", rng=1))
        ],
        "QatOptimizer.__new__": [
            (
                "QatOptimizer",
                quantrs.QatOptimizer,
                dict(master=np.ones((2, 4)), config="int8", rng=1, grid="deploy", group_size=2),
            )
        ],
        "QatOptimizer.step": [
            (
                "QatOptimizer.step",
                qat_opt.step,
                dict(master=np.ones(8), grad=np.ones(8), rng=1),
            )
        ],
        "QatOptimizer.from_bytes": [
            (
                "QatOptimizer.from_bytes",
                quantrs.QatOptimizer.from_bytes,
                dict(data=qat_opt.to_bytes(), shape=[8]),
            )
        ],
        # the setters a torch param group's changes go through (docs/torch.md)
        "QatOptimizer.set_lr": [("QatOptimizer.set_lr", qat_opt.set_lr, dict(lr=1e-3))],
        "QatOptimizer.set_betas": [("set_betas", qat_opt.set_betas, dict(beta1=0.9, beta2=0.999))],
        "QatOptimizer.set_eps": [("set_eps", qat_opt.set_eps, dict(eps=1e-8))],
        "QatOptimizer.set_weight_decay": [
            ("set_weight_decay", qat_opt.set_weight_decay, dict(weight_decay=0.0))
        ],
        "QatOptimizer.set_hyper": [
            (
                "QatOptimizer.set_hyper",
                qat_opt.set_hyper,
                dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0),
            )
        ],
        "QatOptimizer.set_rounding": [
            ("set_rounding", qat_opt.set_rounding, dict(rounding="nearest"))
        ],
        "QatOptimizer.set_seed": [("set_seed", qat_opt.set_seed, dict(seed=1))],
        "QatOptimizer.set_moments": [
            ("set_moments", qat_opt.set_moments, dict(step=1, m=np.zeros(8), v=np.zeros(8)))
        ],
        "qat_calibrate_per_channel": [
            (
                "qat_calibrate_per_channel",
                _core.qat_calibrate_per_channel,
                dict(x=X, axis=0, target="int8", scheme="symmetric", clip_fraction=0.0),
            )
        ],
        "qat_fake_quant": [
            (
                "qat_fake_quant",
                _core.qat_fake_quant,
                dict(
                    x=X,
                    target="int8",
                    scheme="symmetric",
                    rounding="nearest",
                    rng=1,
                    clip_fraction=0.0,
                    axis=None,
                ),
            )
        ],
        "qat_fake_quant_backward": [
            (
                "qat_fake_quant_backward",
                _core.qat_fake_quant_backward,
                dict(grad=X, x=X, lo=-1.0, hi=1.0),
            )
        ],
        "Adam4bitOptimizerConfig.__new__": [
            (
                "Adam4bitOptimizerConfig",
                quantrs.Adam4bitOptimizerConfig,
                dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0),
            )
        ],
        "AdvancedQuantizationConfig.__new__": [
            (
                "AdvancedQuantizationConfig",
                quantrs.AdvancedQuantizationConfig,
                dict(
                    method="nf4",
                    block_size=64,
                    adaptation_rate=0.01,
                    min_scale=1e-8,
                    max_scale=1e8,
                    double_quantization=True,
                    rank1_normalization=False,
                    variance_map="sqrt_log",
                ),
            )
        ],
        "StateMemoryStats.__new__": [
            (
                "StateMemoryStats",
                quantrs.StateMemoryStats,
                dict(
                    momentum_elements=1,
                    variance_elements=1,
                    third_moment_elements=0,
                    total_bytes=8,
                    num_parameters=1,
                ),
            )
        ],
        "_Adam4bitBase.__new__": [
            (
                cls.__name__,
                cls,
                dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0),
            )
            for cls in (quantrs.Adam4bit, quantrs.AdamW4bit)
        ],
        "_Adam4bitBase.update": [("update", opt.update, dict(param=p, grad=g, name="w"))],
        "_Adam4bitBase.accumulate_grad": [
            ("accumulate_grad", opt.accumulate_grad, dict(param=p, grad=g, name="w"))
        ],
        "_Adam4bitBase.lr=": [("lr = value", setter(opt, "lr"), dict(value=1e-3))],
        "_Adam4bitBase.set_lr": [("set_lr", opt.set_lr, dict(lr=1e-3))],
        "_Adam4bitBase.set_hyper": [
            (
                "_Adam4bitBase.set_hyper",
                opt.set_hyper,
                dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0),
            )
        ],
        "_Adam4bitBase.export_param_state": [
            ("export_param_state", stepped.export_param_state, dict(name="w"))
        ],
        "_Adam4bitBase.import_param_state": [
            (
                "import_param_state",
                stepped.import_param_state,
                dict(name="w", shape=[8], step=exported[0], arrays=exported[1]),
            )
        ],
        "_Adam4bitBase.set_row_layout": [
            ("set_row_layout", quantrs.AdamW4bit().set_row_layout, dict(first_row=1, global_rows=4))
        ],
        "_Adam4bitBase.apply_accumulated_grads": [
            ("apply_accumulated_grads", opt.apply_accumulated_grads, dict(accumulation_steps=1))
        ],
        "_Adam4bitBase.save_state": [("save_state", opt.save_state, dict(path=path))],
        "_Adam4bitBase.load_state": [
            ("load_state", quantrs.AdamW4bit().load_state, dict(path=str(tmp / "o.st")))
        ],
        "_Adam4bitBase.__setstate__": [
            (
                "__setstate__",
                positional(quantrs.AdamW4bit().__setstate__, ["state"]),
                dict(state=opt.__getstate__()),
            )
        ],
    }
    return calls


def _write_fp8(path: Path, layer) -> None:
    """A compressed-tensors style FP8 file with the tensor `l.weight`."""
    import json
    import struct

    w = np.ascontiguousarray(layer.weight)
    s = np.array([layer.weight_scale_inv], np.float32)
    header = {
        "l.weight": {"dtype": "F8_E4M3", "shape": list(w.shape), "data_offsets": [0, w.nbytes]},
        "l.weight_scale": {
            "dtype": "F32",
            "shape": [1],
            "data_offsets": [w.nbytes, w.nbytes + 4],
        },
    }
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + w.tobytes() + s.tobytes())


# --- the Python wrappers: their own signatures, the same kinds ------------------

PY_FUNCS = {
    "fp8.encode": (quantrs.fp8.encode, dict(x=X, fmt="e4m3", saturate=False, as_ml_dtypes=False)),
    "fp8.decode": (quantrs.fp8.decode, dict(codes=np.zeros(3, np.uint8), fmt="e4m3")),
    "qat.calibrate": (
        quantrs.qat.calibrate,
        dict(x=X, target="int8", scheme="symmetric", clip_fraction=0.0, axis=0),
    ),
    "qat.fake_quant": (
        quantrs.qat.fake_quant,
        dict(x=X, target="int8", scheme="symmetric", rounding="nearest", rng=1, clip_fraction=0.0),
    ),
    "qat.fake_quant_backward": (
        quantrs.qat.fake_quant_backward,
        dict(grad=X, x=X, lo=-1.0, hi=1.0),
    ),
}


def py_scalars() -> dict[str, list[tuple[str, str, bool]]]:
    out = {}
    for name, (fn, _) in PY_FUNCS.items():
        params = []
        for p in inspect.signature(fn).parameters.values():
            kind, optional = kind_of(str(p.annotation))
            if kind is not None:
                params.append((p.name, kind, optional))
        out[name] = params
    return out


def py_cases():
    return [
        pytest.param(name, arg, kind, value, id=f"{name}-{arg}-{value!r}")
        for name, params in sorted(py_scalars().items())
        for arg, kind, optional in params
        for value in wrong_values(kind, optional)
    ]


# --- wrong values per kind -----------------------------------------------------

WRONG = {
    "int": [1.5, "3", [1], True],
    "float": ["0.5", [0.5], True, b"1"],
    "bool": ["False", 0, 1.0, [True]],
    "str": [3, 1.5, b"x", ["x"]],
    "enum": [3, 1.5, b"x", ["x"]],
    "path": [3, 1.5, ["x"]],
    "bytes": [3, "x", [1], 1.5],
    "rng": [1.5, "3", [1], True],
    "shape": ["ab", 3, [1.5], {"a": 1}],
}


def wrong_values(kind: str, optional: bool) -> list:
    return WRONG[kind] + ([] if optional else [None])


def test_every_scalar_argument_is_covered(tmp_path):
    covered = valid_calls(tmp_path)
    stub = stub_scalars()
    missing = sorted(set(stub) - set(covered))
    assert missing == [], f"add a valid call to valid_calls for: {missing}"
    for name, calls in covered.items():
        assert name in stub, f"{name}: not in _core.pyi (or has no scalar argument)"
        args = {a for a, _, _ in stub[name]}
        for label, _, kwargs in calls:
            if not name.endswith("="):
                assert args <= set(kwargs), f"{label}: give every scalar argument a valid value"


def test_valid_calls_succeed(tmp_path):
    for calls in valid_calls(tmp_path).values():
        for _, call, kwargs in calls:
            call(**kwargs)


def cases():
    out = []
    for name, params in sorted(stub_scalars().items()):
        for arg, kind, optional in params:
            for value in wrong_values(kind, optional):
                out.append(pytest.param(name, arg, kind, value, id=f"{name}-{arg}-{value!r}"))
    return out


@pytest.mark.parametrize("name,arg,kind,value", cases())
def test_wrong_type_names_the_argument(tmp_path, name, arg, kind, value):
    # A setter's value is named after the attribute (`opt.lr = "x"`: "lr: ...").
    key, shown = ("value", name.split(".")[1].rstrip("=")) if name.endswith("=") else (arg, arg)
    # A shape's elements are checked one by one ("shape[0]: expected int, got float").
    actual = type(value[0] if kind == "shape" and isinstance(value, list) else value).__name__
    for label, call, kwargs in valid_calls(tmp_path)[name]:
        with pytest.raises(TypeError) as info:
            call(**{**kwargs, key: value})
        msg = str(info.value)
        assert re.search(rf"\b{re.escape(shown)}(\[\d+\])?: expected ", msg), f"{label}: {msg}"
        assert f"got {actual}" in msg, f"{label}: {msg}"


def test_python_wrappers_scalars_are_found():
    found = {name: {a for a, _, _ in params} for name, params in py_scalars().items()}
    assert found["fp8.encode"] == {"fmt", "saturate", "as_ml_dtypes"}
    assert found["qat.fake_quant"] == {
        "target",
        "scheme",
        "rounding",
        "rng",
        "clip_fraction",
        "axis",
    }
    for fn, kwargs in PY_FUNCS.values():
        fn(**kwargs)


@pytest.mark.parametrize("name,arg,kind,value", py_cases())
def test_python_wrapper_wrong_type_names_the_argument(name, arg, kind, value):
    fn, kwargs = PY_FUNCS[name]
    with pytest.raises(TypeError) as info:
        fn(**{**kwargs, arg: value})
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(arg)}: expected ", msg), f"{name}: {msg}"
    assert f"got {type(value).__name__}" in msg, f"{name}: {msg}"
