"""``quantrs bench``: run the benchmark scripts in ``benches/`` and print one table.

Convention (docs/cli.md): each ``benches/bench_*.py`` is a script that accepts
``--quick`` and ``--json`` and, with ``--json``, prints a JSON list of rows on stdout
(it also defines ``run(quick: bool) -> list[dict]`` returning the same rows). A row:

- ``bench`` (str): the case, e.g. ``"int4 matvec 4096x11008 g32 b1"`` (``name`` is
  accepted too);
- ``ours_ms`` (float or null): median milliseconds of the quantrs kernel;
- ``baseline`` (str): what it is compared with, e.g. ``"numpy f32 x@W"``;
- ``baseline_ms`` (float or null): median milliseconds of that baseline, same run;
- ``ratio`` (float or null): ``baseline_ms / ours_ms`` (> 1: quantrs is faster);
  computed here when absent;
- anything else (``target``, ``weight_GB/s``, ...) is shown as "extra" and kept in JSON.

Each suite runs in its own interpreter: a crash or a leak in one cannot take down the
others, BLAS threads start cold, memory is returned between suites, and the script
applies its own environment fixes (e.g. dropping OpenBLAS overrides) as when run by hand.

``benches/`` is not part of the installed package: it is looked up in ``--dir``,
``$QUANTRS_BENCHES``, the current directory and its parents, and next to the
package's source tree (an editable install from a clone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ._errors import CliError
from ._table import table

PATTERN = "bench_*.py"
_STANDARD = ("suite", "bench", "name", "ours_ms", "baseline", "baseline_ms", "ratio")


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


def _num(v: object) -> float | None:
    return None if v is None else float(v)


def _check_row(row: object, suite: str) -> dict:
    if not isinstance(row, dict) or not ({"bench", "name"} & row.keys()):
        raise ValueError(f"row {row!r} has no 'bench' name")
    out = dict(row)
    out["suite"] = suite
    out["bench"] = str(out.pop("bench", None) or out.pop("name"))
    out["ours_ms"] = _num(out.get("ours_ms"))
    out["baseline_ms"] = _num(out.get("baseline_ms"))
    out.setdefault("baseline", "")
    ours, base = out["ours_ms"], out["baseline_ms"]
    if out.get("ratio") is None:
        out["ratio"] = base / ours if ours and base is not None else None
    return out


def _run_suite(path: Path, quick: bool) -> list:
    cmd = [sys.executable, str(path), "--json"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=path.parent)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "unrecognized arguments" in tail:
            tail += " (bench scripts take --json and --quick: see docs/cli.md)"
        raise RuntimeError(f"exit status {proc.returncode}: {tail}")
    lines = proc.stdout.splitlines()
    # tolerate chatter before the JSON document
    start = next((i for i, line in enumerate(lines) if line.startswith("[")), None)
    try:
        rows = None if start is None else json.loads("\n".join(lines[start:]))
    except ValueError:
        rows = None
    if not isinstance(rows, list):
        raise ValueError("printed no JSON list of rows with --json (see docs/cli.md)")
    return rows


def run_benches(directory: Path, quick: bool, only: list[str] | None, log=None):
    """``(rows, failures)``: rows of every suite, and ``[(suite, message)]``."""
    log = log or sys.stderr
    rows, failures = [], []
    scripts = sorted(directory.glob(PATTERN))
    if only:
        scripts = [s for s in scripts if any(o in s.stem for o in only)]
        if not scripts:
            raise CliError(f"no bench script in {directory} matches {' '.join(only)}")
    for path in scripts:
        suite = path.stem.removeprefix("bench_")
        print(f"running {path.name} ...", file=log, flush=True)
        t0 = time.perf_counter()
        try:
            rows += [_check_row(r, suite) for r in _run_suite(path, quick)]
        except (RuntimeError, ValueError, OSError) as e:  # report, run the other suites
            failures.append((suite, str(e)))
        print(f"  {path.name}: {time.perf_counter() - t0:.1f} s", file=log, flush=True)
    return rows, failures


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def format_bench(rows: list[dict], failures) -> str:
    body = []
    for r in rows:
        extra = ", ".join(
            f"{k}={_fmt(v)}" for k, v in r.items() if k not in _STANDARD and v is not None
        )
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
        body.append(
            [
                r["suite"],
                r["bench"],
                _fmt(r["ours_ms"]),
                r["baseline"] or "-",
                _fmt(r["baseline_ms"]),
                ratio,
                extra,
            ]
        )
    head = ["suite", "case", "quantrs ms", "baseline", "baseline ms", "speed-up", "extra"]
    out = [table(head, body)] if body else ["(no results)"]
    out += [f"FAILED {s}: {m}" for s, m in failures]
    return "\n".join(out)


def machine_line() -> str:
    from .. import build_info

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"quantrs {json.dumps(build_info())}; {os.cpu_count()} cores, load {load:.2f}"


def bench_json(rows: list[dict], failures) -> str:
    return json.dumps(
        {"rows": rows, "failures": [{"suite": s, "error": m} for s, m in failures]}, indent=1
    )
