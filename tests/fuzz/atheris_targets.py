"""atheris targets for the Python entry points that read untrusted bytes
(docs/security.md). Each target takes one input; an exception other than the
documented ones (``quantrs.SerializationError`` and the other ``ValueError``
subclasses of quantrs, ``quantrs.formats.FormatError`` for the GGUF reader,
and the CLI's one-line ``CliError``) is a crash.

    python tests/fuzz/atheris_targets.py TARGET [libFuzzer flags] [CORPUS_DIR]

``TARGET`` is one of ``TARGETS``; the seeds are valid encodings written to a
corpus folder (``--seeds DIR`` writes them and exits). The memory cap is the
caller's: ``tests/python/test_fuzz_atheris.py`` runs each target under
``RLIMIT_AS`` (the process's size at start plus 256 MiB), so an
over-allocation fails the run. The long run (docs/security.md):

    QUANTRS_FUZZ_SECONDS=600 python -m pytest -q tests/python/test_fuzz_atheris.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np

import quantrs
from quantrs.cli import main as cli_main
from quantrs.formats import FormatError
from quantrs.formats.gguf import GgufFile, read_gguf_weight
from quantrs.formats.gguf_write import save_gguf

SHAPE = (6, 10)
_TMP = tempfile.mkdtemp(prefix="quantrs-fuzz-")


def _seeds() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 3)).astype(np.float32)
    qw = quantrs.QuantizedWeight.quantize(w)
    fp8 = quantrs.PerTensorFP8Linear.from_float(rng.standard_normal((4, 8)).astype(np.float32))
    int8 = quantrs.Int8Linear.from_float(rng.standard_normal((4, 8)).astype(np.float32))
    opt = quantrs.AdamW4bit(1e-3)
    p = rng.standard_normal(SHAPE).astype(np.float32)
    opt.update(p, rng.standard_normal(SHAPE).astype(np.float32), name="w")
    opt.step()
    qat = quantrs.QatOptimizer(rng.standard_normal(SHAPE).astype(np.float32), "int8")
    gguf_path = os.path.join(_TMP, "seed.gguf")
    save_gguf(gguf_path, {"blk.0.w": qw, "blk.1.w": quantrs.QuantizedWeight.quantize(w[:32])})
    with open(gguf_path, "rb") as f:
        gguf = f.read()
    return {
        "int4_from_bytes": [qw.to_bytes()],
        "layer_deserialize": [fp8.serialize(), int8.serialize()],
        "optimizer_setstate": [opt.__getstate__()],
        "qat_from_bytes": [qat.to_bytes()],
        "cli_inspect": [qw.to_bytes(), opt.__getstate__()],
        "gguf_load": [gguf],
    }


def int4_from_bytes(data: bytes) -> None:
    try:
        quantrs.QuantizedWeight.from_bytes(data)
    except quantrs.SerializationError:
        pass


def layer_deserialize(data: bytes) -> None:
    for cls in (quantrs.PerTensorFP8Linear, quantrs.Int8Linear, quantrs.Int4Linear):
        try:
            cls.deserialize(data).dequantize_w()
        except quantrs.SerializationError:
            pass


def optimizer_setstate(data: bytes) -> None:
    opt = quantrs.AdamW4bit(1e-3)
    try:
        opt.__setstate__(data)
    except quantrs.SerializationError:
        pass


def qat_from_bytes(data: bytes) -> None:
    try:
        quantrs.QatOptimizer.from_bytes(data, SHAPE)
    except (quantrs.SerializationError, quantrs.DimensionMismatch):
        pass


def cli_inspect(data: bytes) -> None:
    path = os.path.join(_TMP, "in.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    devnull = open(os.devnull, "w")  # noqa: SIM115 (restored below)
    old = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = devnull
    try:
        rc = cli_main(["inspect", path])
    finally:
        sys.stdout, sys.stderr = old
        devnull.close()
    if rc not in (0, 1):
        raise AssertionError(f"inspect exited {rc}")


def gguf_load(data: bytes) -> None:
    """The GGUF reader (``quantrs.formats.load_gguf``): parse, then read every
    tensor (at most 8) as a ``QuantizedWeight`` (re-quantizing what is not
    Q4_0) and dequantize it."""
    path = os.path.join(_TMP, "in.gguf")
    with open(path, "wb") as f:
        f.write(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RequantizedWarning
        try:
            with GgufFile(path) as g:
                for name in list(g.tensors)[:8]:
                    try:
                        read_gguf_weight(g, name, requantize_ok=True)
                    except FormatError:
                        pass
                    try:
                        g.dequantize(g.tensors[name])
                    except FormatError:
                        pass
        except FormatError:
            pass


TARGETS = {
    f.__name__: f
    for f in (
        int4_from_bytes,
        layer_deserialize,
        optimizer_setstate,
        qat_from_bytes,
        cli_inspect,
        gguf_load,
    )
}


def write_seeds(folder: str, target: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for i, s in enumerate(_seeds()[target]):
        with open(os.path.join(folder, f"seed{i}"), "wb") as f:
            f.write(s)


def main() -> None:
    import atheris

    target = sys.argv[1]
    if len(sys.argv) > 3 and sys.argv[2] == "--seeds":
        write_seeds(sys.argv[3], target)
        return
    fn = TARGETS[target]
    if target == "gguf_load":
        # The reader is Python: its bytecode gives atheris coverage feedback.
        from quantrs.formats import gguf

        for f in (
            gguf._Cursor.value,
            gguf._Cursor.string,
            gguf.GgufFile._parse,
            gguf.GgufFile.dequantize,
            gguf.read_gguf_weight,
            gguf.q4_0_to_quantrs,
        ):
            atheris.instrument_func(f)
    atheris.Setup([sys.argv[0], *sys.argv[2:]], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
