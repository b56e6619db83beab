"""The ``quantrs`` command line (also ``python -m quantrs``).

Subcommands: ``demo``, ``quantize``, ``convert``, ``inspect``, ``bench``; each has
``--help``.
A user mistake (bad argument, missing, corrupt or truncated file) prints one line,
``quantrs <command>: error: ...``, on stderr and exits with status 1 (2 for
argument-syntax errors, as argparse does); tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from ..formats import FormatError
from ..formats._ggml_types import QUANTIZE_TYPES as GGML_QUANTIZE_TYPES
from ._demo import EPOCHS
from ._errors import CliError
from ._layout import load_int4

__all__ = ["CliError", "load_int4", "main"]


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quantrs",
        description="Low-bit training and inference on NumPy arrays (Rust core).",
    )
    p.add_argument("--version", action="store_true", help="print the version and build info")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser(
        "demo",
        help="train a small MLP on the embedded digits: float32 vs 4-bit vs QAT, then serve it",
        description="Train a 64-64-10 MLP on the 8x8 digits shipped with quantrs with float32 "
        "AdamW (NumPy), AdamW4bit and QAT int8/int4/fp8, then serve the float model through "
        "INT4 and FP8 kernels; print one table.",
    )
    d.add_argument("--seed", type=int, default=0, help="seed for init and batch order (0)")
    d.add_argument("--epochs", type=_positive, default=EPOCHS, help=f"training epochs ({EPOCHS})")
    d.add_argument("--plot", metavar="PATH", help="write a PNG of the loss curves (matplotlib)")
    d.add_argument("--json", action="store_true", help="print JSON instead of the table")

    q = sub.add_parser(
        "quantize",
        help="quantize the linear weights of a safetensors file, Hugging Face model folder or "
        "GGUF file",
        description="Quantize the 2-D weights of linear layers (or the tensors --include picks) "
        "of IN, a .safetensors file or a model folder (sharded or not), to INT4 (symmetric or "
        "asymmetric), FP8 E4M3 or a GGUF block type (llama.cpp's quantizer, the same bytes), "
        "optionally calibrated on text (importance or GPTQ); "
        "copy everything else; write OUT (a file, or a folder with its index, config.json "
        "quantization_config and the other files) atomically. A GGUF IN (a GGUF block type, "
        "OUT ending in .gguf) gives a GGUF file llama.cpp loads, as llama-quantize makes one: "
        "the block linears (blk.N.*.weight) quantized, every other tensor and all metadata "
        "copied. See docs/cli.md and docs/checkpoints.md.",
    )
    q.add_argument("input", metavar="IN", help="input .safetensors file, model folder or .gguf")
    q.add_argument(
        "output", metavar="OUT", help="output file (a folder for a folder IN; .gguf for a GGUF IN)"
    )
    q.add_argument(
        "--format",
        required=True,
        choices=["int4", "int4_asym", "int4_k", "fp8", *GGML_QUANTIZE_TYPES],
        help="target format: int4 (symmetric, f32 scale per group), int4_asym (f16 step and "
        "minimum per group, inputs a multiple of 32), int4_k (k-quant style: groups of 32 "
        "with 6-bit step and minimum codes under f16 super-block scales, 4.5 bits per "
        "weight, inputs a multiple of 32), fp8 (E4M3, per-tensor scale), or a GGUF block "
        "type, quantized as llama.cpp does (bits per weight: q4_0 4.5, q4_1 5, q5_0 5.5, "
        "q5_1 6, q8_0 8.5, q4_k 4.5, q5_k 5.5, q6_k 6.5625; inputs not a multiple of 256 "
        "take llama.cpp's fallback q4_k->q5_0, q5_k->q5_1, q6_k->q8_0, and a weight whose "
        "inputs are not a multiple of 32 stays float; the report names each)",
    )
    q.add_argument(
        "--group-size",
        type=_positive,
        default=32,
        help="INT4 group size: even for int4, a multiple of 32 for int4_asym, 32 for int4_k "
        "and the GGUF types (fixed blocks) (32)",
    )
    q.add_argument(
        "--method",
        choices=["rtn", "full", "search", "gptq", "ggml"],
        help="quantizer (docs/int4.md): search (the default: least squared error, weighted "
        "by the importance --calibration gives), rtn (int4: absmax/7, the grid of earlier "
        "releases; int4_asym / int4_k: group ranges), full (int4 only: max/-8); gptq (any "
        "INT4 format): GPTQ with the Hessians of --calibration; ggml (the GGUF types' only "
        "one: llama.cpp's, weighted by the importance --calibration gives, as its imatrix)",
    )
    q.add_argument(
        "--calibration",
        metavar="TEXT",
        help="a text file run through IN's float model first (IN a model folder with its "
        "tokenizer, or a GGUF file with its vocabulary; needs PyTorch and transformers): "
        "gives search and the GGUF types each input's importance (mean x^2, llama.cpp's "
        "imatrix) and gptq its Hessians",
    )
    q.add_argument(
        "--calibration-windows",
        type=_positive,
        default=8,
        help="windows of calibration text used (8)",
    )
    q.add_argument(
        "--calibration-length", type=_positive, default=512, help="tokens per window (512)"
    )
    q.add_argument(
        "--layout",
        choices=["compressed-tensors", "mistralrs"],
        default="compressed-tensors",
        help="FP8 tensor names: weight_scale [1] (compressed-tensors, vLLM) or "
        "weight_scale_inv (mistralrs) (compressed-tensors)",
    )
    q.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="quantize the tensors whose name matches (repeatable; replaces the default "
        "linear-weights rule; '*' = every 2-D float tensor)",
    )
    q.add_argument(
        "--exclude", action="append", metavar="GLOB", help="keep matching tensors (repeatable)"
    )
    q.add_argument("--no-progress", action="store_true", help="no progress bar")
    q.add_argument("--json", action="store_true", help="print the report as JSON")

    c = sub.add_parser(
        "convert",
        help="convert a GPTQ, AWQ or GGUF checkpoint to quantrs' layout, keeping the exact bits",
        description="Read a GPTQ or AWQ (GEMM) safetensors file / model folder, or a GGUF "
        "file, and write every packed layer in the quantrs type that holds it exactly: GGUF "
        "Q4_0 as int4 group 32, Q4_1 as int4_asym group 32, Q8_0, Q5_0/Q5_1 and k-quants "
        "(Q4_K, Q5_K, Q6_K) kept as their ggml blocks (token_embd.weight included); GPTQ / "
        "AWQ as int4 when symmetric 4-bit in input order, else as int_zp (zero points, "
        "8-bit, act-order). Other tensors (norms, biases, float tensors) are copied. A "
        "tensor no quantrs type holds (GGUF IQ types, GPTQ 2-bit, ...) stops the "
        "conversion naming it, unless --requantize re-quantizes it to int4 (error in the "
        "report). OUT is written atomically. A GGUF IN with an OUT not ending in "
        ".safetensors gives a model folder (PyTorch tensor names, config.json, tokenizer) "
        "that quantrs.torch.load_pretrained loads. See docs/checkpoints.md.",
    )
    c.add_argument("input", metavar="IN", help="input file or model folder")
    c.add_argument(
        "output", metavar="OUT", help="output .safetensors file (or model folder, GGUF IN)"
    )
    c.add_argument("--from", dest="source", required=True, choices=["gptq", "awq", "gguf"])
    c.add_argument(
        "--requantize",
        action="store_true",
        help="dequantize and re-quantize what is not exactly representable (error reported)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--json", action="store_true", help="print the report as JSON")

    i = sub.add_parser(
        "inspect",
        help="list the tensors of a safetensors file or model folder and how each is quantized",
        description="List tensors, dtypes, shapes, bytes and quantization kind (naming the "
        "dialect of every FP8 tensor).",
    )
    i.add_argument("file", metavar="PATH", help=".safetensors file or model folder")
    i.add_argument("--json", action="store_true", help="print JSON instead of the table")

    b = sub.add_parser(
        "bench",
        help="run the benchmarks in benches/ and print speed-ups over the baselines",
        description="Run benches/bench_*.py (from a source checkout) and print one table of "
        "speed-ups over NumPy (and ml_dtypes / PyTorch where installed).",
    )
    b.add_argument("--quick", action="store_true", help="small sizes, a few seconds per suite")
    b.add_argument("--json", action="store_true", help="print JSON instead of the table")
    b.add_argument("--dir", help="the benches/ directory (default: found automatically)")
    b.add_argument("--only", nargs="+", metavar="SUITE", help="run only these suites")
    return p


def _cmd_demo(args) -> int:
    from ._demo import run_demo
    from ._report import demo_json, demo_table, write_plot

    if args.plot:
        plot_dir = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(plot_dir):
            raise CliError(f"--plot: directory {plot_dir!r} does not exist")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError(
                "--plot needs matplotlib, which is not installed (pip install 'quantrs[plot]')"
            ) from None
    settings, rows = run_demo(seed=args.seed, epochs=args.epochs)
    print(demo_json(settings, rows) if args.json else demo_table(settings, rows))
    if args.plot:
        write_plot(rows, args.plot)
        print(f"loss curves written to {args.plot}", file=sys.stderr)
    return 0


def _cmd_quantize(args) -> int:
    from ._folder import quantize_folder
    from ._quantize import format_report, quantize_file
    from ._quantize_gguf import is_gguf, not_gguf_message
    from ._select import Selector

    gguf_in, gguf_out = is_gguf(args.input), args.output.lower().endswith(".gguf")
    if gguf_out and not gguf_in and os.path.exists(args.input):
        raise CliError(not_gguf_message(args.input))
    if gguf_in and not gguf_out:
        raise CliError(
            f"IN {args.input!r} is a GGUF file: OUT must end in .gguf (GGUF in, GGUF out); "
            "quantrs convert IN OUT --from gguf writes its exact bits in quantrs' layout"
        )
    selector = Selector(args.include, args.exclude)
    if gguf_in:
        return _quantize_to_gguf(args, selector)
    opts = dict(
        group_size=args.group_size,
        progress=not args.no_progress,
        layout=args.layout,
        selector=selector,
        method=args.method,
    )
    if os.path.isdir(args.input):
        rows, summary = quantize_folder(
            args.input,
            args.output,
            args.format,
            **opts,
            calibration=args.calibration,
            windows=args.calibration_windows,
            length=args.calibration_length,
        )
    else:
        if args.calibration is not None or args.method == "gptq":
            raise CliError(
                "--calibration (and --method gptq) need IN to be a model folder "
                "(--calibration: or a GGUF file, with a .gguf OUT)"
            )
        rows, summary = quantize_file(args.input, args.output, args.format, **opts), None
    if args.json:
        print(json.dumps(rows if summary is None else {**summary, "tensors": rows}, indent=1))
    else:
        print(format_report(rows))
        if summary is not None:
            print(f"wrote {summary['output']}: {len(summary['shards'])} shard(s), copied "
                  f"{', '.join(summary['files_copied']) or 'no other files'}")  # fmt: skip
    return 0


def _quantize_to_gguf(args, selector) -> int:
    from ._quantize import format_report
    from ._quantize_gguf import check_gguf_options, quantize_gguf

    check_gguf_options(args.format, args.group_size, args.method)
    prepared = None
    if args.calibration is not None:
        from ._calibration import prepare_gguf

        prepared = prepare_gguf(
            args.input,
            args.calibration,
            args.format,
            args.method,
            selector,
            args.calibration_windows,
            args.calibration_length,
        )
    rows, summary = quantize_gguf(
        args.input,
        args.output,
        args.format,
        group_size=args.group_size,
        progress=not args.no_progress,
        selector=selector,
        method=args.method,
        prepared=prepared,
    )
    if args.json:
        print(json.dumps({**summary, "tensors": rows}, indent=1))
    else:
        print(format_report(rows))
        print(f"wrote {summary['output']}: {summary['quantized']} tensor(s) quantized, "
              f"general.file_type {summary['file_type']}")  # fmt: skip
    return 0


def _cmd_convert(args) -> int:
    from ._import import convert
    from ._quantize import format_report

    progress = not args.no_progress
    if args.source == "gguf" and not args.output.lower().endswith(".safetensors"):
        from ._import_gguf_folder import convert_gguf_folder

        rows, summary = convert_gguf_folder(args.input, args.output, args.requantize, progress)
        if args.json:
            print(json.dumps({**summary, "tensors": rows}, indent=1))
        else:
            print(format_report(rows))
            left = ", ".join(summary["left_out"]) or "none"
            print(f"wrote {summary['output']} ({summary['architecture']}): model.safetensors, "
                  f"config.json; tokenizer {summary['tokenizer']}; left out: {left}")  # fmt: skip
        return 0
    rows = convert(args.input, args.output, args.source, args.requantize, progress=progress)
    print(json.dumps(rows, indent=1) if args.json else format_report(rows))
    return 0


def _cmd_inspect(args) -> int:
    from ._inspect import format_inspect, inspect_path

    info = inspect_path(args.file)
    print(json.dumps(info, indent=1) if args.json else format_inspect(info))
    return 0


def _cmd_bench(args) -> int:
    from ._bench import bench_json, find_benches, format_bench, machine_line, run_benches

    rows, failures = run_benches(find_benches(args.dir), args.quick, args.only)
    if args.json:
        print(bench_json(rows, failures))
    else:
        print(machine_line())
        print(format_bench(rows, failures))
    return 1 if failures else 0


_COMMANDS = {
    "demo": _cmd_demo,
    "quantize": _cmd_quantize,
    "convert": _cmd_convert,
    "inspect": _cmd_inspect,
    "bench": _cmd_bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``quantrs`` console script; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        from .. import __version__, build_info

        print(f"quantrs {__version__} {json.dumps(build_info())}")
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _COMMANDS[args.command](args)
    except (CliError, FormatError) as e:
        msg = str(e)
    except BrokenPipeError:  # `quantrs inspect big.safetensors | head`: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    except FileNotFoundError as e:
        msg = f"{e.filename}: no such file"
    except IsADirectoryError as e:
        msg = f"{e.filename}: is a directory"
    except PermissionError as e:
        msg = f"{e.filename}: permission denied"
    except OSError as e:  # disk full, I/O error: the user's environment, not a bug
        msg = f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")
    except KeyboardInterrupt:
        print(f"quantrs {args.command}: interrupted", file=sys.stderr)
        return 130
    print(f"quantrs {args.command}: error: {msg}", file=sys.stderr)
    return 1
