"""pyproject.toml gives ranges, not pins: users' environments must resolve the package
and its extras; the exact versions the suite runs with live in requirements-test.txt."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]


def requirements() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = {f"dependencies: {r}": r for r in meta["project"].get("dependencies", [])}
    for extra, rs in meta["project"].get("optional-dependencies", {}).items():
        reqs.update({f"[{extra}]: {r}": r for r in rs})
    reqs.update({f"build-system: {r}": r for r in meta["build-system"]["requires"]})
    return reqs


def pinned(req: str) -> bool:
    """An exact pin: `==` or `===` (an environment marker after `;` does not count)."""
    return re.search(r"===?", req.split(";")[0]) is not None


def test_the_pin_check_sees_a_pin() -> None:
    assert pinned("torch==2.15.0") and pinned("tqdm===4.70.1")
    assert not pinned("torch>=2.8") and not pinned("numpy>=1.26,<3; python_version == '3.11'")


def test_pyproject_has_ranges_not_pins() -> None:
    reqs = requirements()
    assert reqs, "no requirements read"
    assert not [name for name, r in reqs.items() if pinned(r)]
    # Every requirement gives at least a lower bound.
    assert not [name for name, r in reqs.items() if ">=" not in r.split(";")[0]]


def test_the_test_requirements_are_pinned() -> None:
    lines = (ROOT / "requirements-test.txt").read_text(encoding="utf-8").splitlines()
    reqs = [ln for ln in (x.split("#")[0].strip() for x in lines) if ln]
    assert reqs and all(pinned(r) for r in reqs), [r for r in reqs if not pinned(r)]
