"""Number formatting and markdown tables shared by every command and generated page."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned, text left-aligned."""
    if not rows:
        return ""
    numeric = [all(_is_number(row[i]) for row in rows) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _is_number(value: object) -> bool:
    text = str(value).replace(",", "").replace("%", "").replace("x", "").strip()
    if text in ("", "-"):
        return True
    try:
        float(text.split(" ")[0])
    except ValueError:
        return False
    return True


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def shorten(name: str, width: int = 90) -> str:
    """A long name (a kernel's template arguments can run to pages) cut to one table cell."""
    return name if len(name) <= width else name[: width - 3] + "..."


def fmt(value: object, spec: str, scale: float = 1.0) -> str:
    """Format a number, or '-' when it is missing."""
    return "-" if value is None else format(float(value) * scale, spec)
