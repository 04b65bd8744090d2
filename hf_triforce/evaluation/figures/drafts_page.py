"""The docs' page of an ``hf-triforce eval-drafts`` result: its markdown report, included in another page, and its
figure.

Example:
    >>> demote_headings("# Title\\n## Part", 2)
    '### Title\\n#### Part'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..drafts.report import markdown_report
from .drafts_plot import write_eval_plot


def write_eval_drafts(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.md`` (the eval report, headings moved two levels down) and ``<stem>.png`` (its figure)."""
    table = out / f"{stem}.md"
    table.write_text(demote_headings(markdown_report(results), 2))
    return [table, Path(write_eval_plot(results, out / f"{stem}.png"))]


def demote_headings(markdown: str, levels: int) -> str:
    r"""Add ``levels`` ``#`` to every ATX heading outside code fences, so a page can be included in another.

    Example:
        >>> demote_headings("# Title\n```\n# code\n```\n## Part", 2)
        '### Title\n```\n# code\n```\n#### Part'
    """
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" * levels + line
        lines.append(line)
    return "\n".join(lines)
