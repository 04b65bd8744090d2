"""mkdocs hook: replace ``<!-- triforce-config-table -->`` with a table of every ``TriForceConfig`` field.

The table (name, default, kept or deprecated, what it does) is built from the dataclass fields and their ``help``
and ``deprecated`` metadata, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import dataclasses

MARKER = "<!-- triforce-config-table -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Expand the marker on any page that has it."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_table())


def config_table() -> str:
    """Markdown table of ``TriForceConfig``'s fields: ``| knob | default | status | what it does |``; the status
    of a deprecated field (``metadata["deprecated"]``) says so and what replaces it."""
    from hf_triforce import TriForceConfig
    from hf_triforce.config import REMOVED_IN

    lines = ["| knob | default | status | what it does |", "|---|---|---|---|"]
    for field in dataclasses.fields(TriForceConfig):
        help_text = _cell(field.metadata.get("help", ""))
        instead = field.metadata.get("deprecated")
        status = "kept" if instead is None else f"**deprecated**, removed in {REMOVED_IN}: {_cell(instead)}"
        lines.append(f"| `{field.name}` | `{field.default!r}` | {status} | {help_text} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` on one line, its pipes escaped for a table cell."""
    return " ".join(text.split()).replace("|", "\\|")
