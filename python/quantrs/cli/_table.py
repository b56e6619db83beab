"""Plain-text tables: right-aligned numbers, left-aligned text, Markdown-compatible."""

from __future__ import annotations

from collections.abc import Sequence


def _cell(v: object) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _looks_numeric(s: str) -> bool:
    t = s.replace(",", "").rstrip("x%")
    try:
        float(t)
    except ValueError:
        return s in ("", "-")
    return True


def table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown pipe table, padded so it also reads well in a terminal."""
    cells = [[_cell(v) for v in r] for r in rows]
    numeric = [i > 0 and all(_looks_numeric(r[i]) for r in cells) for i in range(len(head))]
    width = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]

    def line(vals: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(vals, width, numeric)]
        return "| " + " | ".join(parts) + " |"

    rule = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if n else "-" * (w + 2) for w, n in zip(width, numeric))
        + "|"
    )
    return "\n".join([line(head), rule] + [line(r) for r in cells])
