"""Asymmetric INT4 (``quantrs.Int4AsymWeight.matmul``, the fused ``d * sum(q x) + m *
sum(x)`` kernel) against quantrs INT4 g32 (``QuantizedWeight.matmul``) on the same
``[out, in]`` shape, batch 1 and 16, alternating in one process (``paired_ms``); GGUF
``q4_1`` (the same values as ``int4_asym`` g32, decoded block by block then dotted) is
a row of its own. ``per_byte_ratio`` is the INT4 time per weight byte over ours per
weight byte: > 1 means ours streams its bytes faster. ``int4_k`` (the k-quant-style
format: 6-bit group codes under a half pair per super-block) runs on the same fused
group dot and is a row of its own. The shapes default to one ``[4096, 4096]`` from
DRAM; ``--shapes`` takes others (SmolLM2-135M's are ``576x576,1536x576,576x1536``).
``--baseline-build DIR`` times each weight instead against the same weight of another
build of quantrs (``DIR`` a copy of a built ``python/quantrs``, e.g. main's, loaded
beside this one), paired and alternating in this process; ``--threads N`` sets both
builds' thread count.
Run: ``python benches/bench_int4_asym.py [--quick] [--json] [--shapes 576x576,...]
[--baseline-build DIR] [--threads N]``."""

from __future__ import annotations

import sys

import numpy as np
from _common import emit, machine_note, paired_ms, reexec_without_openblas_overrides
from bench_gguf import against_int4_g32


def run(quick: bool, shapes=None) -> list[dict]:
    return against_int4_g32(asym_cases, quick, shapes)


def load_build(path: str):
    """The quantrs package at ``path`` (a copy of a built ``python/quantrs``, its
    ``_core`` included) as the module ``quantrs_baseline``, beside this build's
    ``quantrs`` (the package imports its parts relatively)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "quantrs_baseline", f"{path}/__init__.py", submodule_search_locations=[path]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["quantrs_baseline"] = mod
    spec.loader.exec_module(mod)
    return mod


def against_build(make_cases, base, quick: bool, shapes=None) -> list[dict]:
    """``make_cases(w, rng, q)``'s weights built by this quantrs and by ``base`` (another
    build, ``load_build``) from the same ``w``, ``matmul`` at batch 1 and 16 paired and
    alternating: ``ratio`` > 1 means this build is faster."""
    import quantrs

    rng = np.random.default_rng(0)
    rows = []
    for out, inf in shapes or ([(1024, 1024)] if quick else [(4096, 4096)]):
        w = rng.standard_normal((out, inf)).astype(np.float32)
        ours = make_cases(w, np.random.default_rng(1), quantrs)
        theirs = make_cases(w, np.random.default_rng(1), base)
        for name, q in ours.items():
            for batch in (1, 16):
                x = rng.standard_normal((batch, inf)).astype(np.float32)
                base_ms, ours_ms, ratio = paired_ms(
                    lambda b=theirs[name], x=x: b.matmul(x),
                    lambda q=q, x=x: q.matmul(x),
                    pairs=3 if quick else 5,
                    inner=5,
                )
                rows.append({
                    "bench": f"{name} [{out}x{inf}] batch {batch}",
                    "ours_ms": round(ours_ms, 3),
                    "baseline": "baseline build",
                    "baseline_ms": round(base_ms, 3),
                    "ratio": round(ratio, 3),
                })  # fmt: skip
    return rows


def main(make_cases, default_shapes=None) -> None:
    """The command line of this script and ``bench_gptq.py`` (module docs)."""
    import quantrs

    reexec_without_openblas_overrides()
    cols = ["bench", "ours_ms", "baseline", "baseline_ms", "ratio", "per_byte_ratio"]
    args = sys.argv[1:]
    shapes = default_shapes
    if "--shapes" in args:  # e.g. 576x576,4096x4096 ([out]x[in])
        spec = args[args.index("--shapes") + 1].split(",")
        shapes = [tuple(int(v) for v in s.split("x")) for s in spec]
    base = None
    if "--baseline-build" in args:
        base = load_build(args[args.index("--baseline-build") + 1])
    if "--threads" in args:
        n = int(args[args.index("--threads") + 1])
        for q in (quantrs, base):
            if q is not None:
                q.threads(n)
    quick = "--quick" in args
    if base is None:
        rows = against_int4_g32(lambda w, rng: make_cases(w, rng, quantrs), quick, shapes)
    else:
        rows = against_build(make_cases, base, quick, shapes)
    emit(rows, cols, "--json" in args)
    print(machine_note())


def asym_cases(w: np.ndarray, rng, quantrs=None) -> dict:
    """``int4_asym`` at groups 32 / 64 / 128 of ``w``, and its g32 values as GGUF q4_1
    blocks (``{d, m, 16 bytes}``): the decode-then-dot path on the same numbers;
    ``quantrs`` the build to make them with (default: this one)."""
    if quantrs is None:
        import quantrs

    out, inf = w.shape
    cases = {
        f"int4_asym g{g}": quantrs.Int4AsymWeight.quantize(w, group_size=g, method="rtn")
        for g in (32, 64, 128)
    }
    g32 = cases["int4_asym g32"]
    sc = g32.scales().astype(np.float16).view(np.uint8).reshape(out, -1, 4)
    codes = g32.codes().reshape(out, -1, 2, 16)
    nib = (codes[:, :, 0] | (codes[:, :, 1] << 4)).astype(np.uint8)
    blocks = np.concatenate([sc, nib], axis=2).reshape(out, -1)
    cases["q4_1 (decode, then dot)"] = quantrs.GgufWeight.from_bytes("q4_1", (out, inf), blocks)
    cases["int4_k"] = quantrs.Int4KWeight.quantize(w, method="rtn")
    return cases


if __name__ == "__main__":
    main(asym_cases)
