"""``quantrs bench``: run the benchmark scripts in ``benches/`` and print one table.

Convention (docs/cli.md): each ``benches/bench_*.py`` defines
``run(quick: bool = False) -> list[dict]``, one dict per measured case with

- ``name`` (str): the case, e.g. ``"matvec 4096x11008 g32"``;
- ``ours_ms`` (float): median milliseconds of the quantrs kernel;
- ``baseline`` (str): what it is compared with, e.g. ``"numpy f32 x @ W"``;
- ``baseline_ms`` (float): median milliseconds of that baseline, same run;
- ``ratio`` (float, optional): ``baseline_ms / ours_ms`` (> 1: quantrs is faster);
  computed here when absent;
- ``target`` / ``note`` (str, optional): the bar from SPEC section 9, remarks.

One row per (case, baseline) pair; a baseline that is not installed (ml_dtypes,
PyTorch) is simply left out. ``quick=True`` must finish in a few seconds.

``benches/`` is not part of the installed package: it is looked up in ``--dir``,
``$QUANTRS_BENCHES``, the current directory and its parents, and next to the
package's source tree (an editable install from a clone).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

from ._errors import CliError
from ._table import table

PATTERN = "bench_*.py"


def find_benches(explicit: str | None = None) -> Path:
    if explicit is not None:
        d = Path(explicit)
        if not d.is_dir():
            raise CliError(f"--dir {explicit!r} is not a directory")
        return d
    candidates = []
    if os.environ.get("QUANTRS_BENCHES"):
        candidates.append(Path(os.environ["QUANTRS_BENCHES"]))
    cwd = Path.cwd()
    candidates += [p / "benches" for p in (cwd, *cwd.parents)]
    candidates.append(Path(__file__).resolve().parents[3] / "benches")
    for d in candidates:
        if d.is_dir() and any(d.glob(PATTERN)):
            return d
    raise CliError(
        "no benches/ directory with bench_*.py scripts found (they ship with the source, "
        "not the wheel): run from a clone of quantrs or pass --dir PATH"
    )


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"_quantrs_bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # let scripts import shared helpers next to them
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def _check_row(row: object, suite: str) -> dict:
    if not isinstance(row, dict) or not {"name", "ours_ms", "baseline_ms"} <= row.keys():
        raise ValueError(f"row {row!r} lacks name / ours_ms / baseline_ms")
    out = dict(row)
    out["suite"] = suite
    out["ours_ms"] = float(out["ours_ms"])
    out["baseline_ms"] = float(out["baseline_ms"])
    out.setdefault("baseline", "numpy")
    if out.get("ratio") is None:
        out["ratio"] = out["baseline_ms"] / out["ours_ms"] if out["ours_ms"] > 0 else float("inf")
    return out


def run_benches(directory: Path, quick: bool, only: list[str] | None, log=None):
    """``(rows, failures)``: rows of every suite, and ``[(suite, message)]``."""
    log = log or sys.stderr
    rows, failures = [], []
    scripts = sorted(directory.glob(PATTERN))
    if only:
        scripts = [s for s in scripts if any(o in s.stem for o in only)]
        if not scripts:
            raise CliError(f"no bench script in {directory} matches {only}")
    for path in scripts:
        suite = path.stem.removeprefix("bench_")
        print(f"running {path.name} ...", file=log, flush=True)
        t0 = time.perf_counter()
        try:
            mod = _load(path)
            if not callable(getattr(mod, "run", None)):
                raise ValueError("defines no run(quick) function (see docs/cli.md)")
            rows += [_check_row(r, suite) for r in mod.run(quick=quick)]
        except Exception as e:  # one broken suite must not hide the others
            failures.append((suite, f"{type(e).__name__}: {e}"))
            if os.environ.get("QUANTRS_DEBUG"):
                traceback.print_exc()
        print(f"  {path.name}: {time.perf_counter() - t0:.1f} s", file=log, flush=True)
    return rows, failures


def format_bench(rows: list[dict], failures) -> str:
    body = [
        [
            r["suite"],
            r["name"],
            round(r["ours_ms"], 3),
            r["baseline"],
            round(r["baseline_ms"], 3),
            f"{r['ratio']:.2f}x",
            r.get("target", ""),
        ]
        for r in rows
    ]
    head = ["suite", "case", "quantrs ms", "baseline", "baseline ms", "speed-up", "target"]
    out = [table(head, body)] if body else ["(no results)"]
    out += [f"FAILED {s}: {m}" for s, m in failures]
    return "\n".join(out)


def bench_json(rows: list[dict], failures) -> str:
    return json.dumps(
        {"rows": rows, "failures": [{"suite": s, "error": m} for s, m in failures]}, indent=1
    )
