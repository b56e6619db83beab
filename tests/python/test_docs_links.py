"""Every relative Markdown link in README.md and docs/*.md points at a file that exists and, when
it names an `#anchor`, at a heading of that file (GitHub's slug rules). Needs no built extension.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) and ![alt](target); the target stops at whitespace (a title may follow).
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[^)]*)?\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(INLINE_CODE.sub("", line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the rendered text lower-cased, every character that is
    not a letter, digit, space, hyphen or underscore dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    kept = []
    for ch in text:
        category = unicodedata.category(ch)
        if ch in " -_" or category[0] in "LN" or category == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of every heading in `path`; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def links(path: Path) -> list[str]:
    """Every link target written in `path`'s prose (code blocks and spans are not links)."""
    found = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        found.extend(m.group(1) for m in INLINE_LINK.finditer(line))
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append(definition.group(1))
    return found


def broken_link(document: Path, target: str) -> str | None:
    """Why `target`, written in `document`, does not resolve, or None when it does."""
    file_part, _, anchor = target.partition("#")
    linked = document if not file_part else (document.parent / file_part).resolve()
    if not linked.exists():
        return f"{target}: no file {linked}"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
        return f"{target}: no heading with the anchor #{anchor} in {linked.name}"
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    relative = [t for t in links(document) if not EXTERNAL.match(t)]
    problems = [p for p in (broken_link(document, t) for t in relative) if p]
    assert not problems, f"{document.relative_to(ROOT)}: " + "; ".join(problems)


def test_slugs_follow_github() -> None:
    assert github_slug("A decode step (`python benches/bench_decode.py`)") == (
        "a-decode-step-python-benchesbench_decodepy"
    )
    assert github_slug("`quantrs bench` and the benchmark convention") == (
        "quantrs-bench-and-the-benchmark-convention"
    )
    assert github_slug("INT4 / FP8: what's kept") == "int4--fp8-whats-kept"


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Title\n\n[ok](#title-1) [bad](#nope) [gone](missing.md)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n",
        encoding="utf-8",
    )
    targets = links(page)
    assert targets == ["#title-1", "#nope", "missing.md"]
    assert broken_link(page, "#title-1") is None
    assert "#nope" in (broken_link(page, "#nope") or "")
    assert "no file" in (broken_link(page, "missing.md") or "")
