"""mkdocs hook: replace ``<!-- triforce-config-table -->`` with a table of every ``TriForceConfig`` field.

The table (name, default, what it does) is built from the dataclass fields and their ``help`` metadata,
so the documentation cannot drift from the code.
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
    """Markdown table of ``TriForceConfig``'s fields: ``| knob | default | what it does |``."""
    from hf_triforce import TriForceConfig

    lines = ["| knob | default | what it does |", "|---|---|---|"]
    for field in dataclasses.fields(TriForceConfig):
        help_text = " ".join(field.metadata.get("help", "").split()).replace("|", "\\|")
        lines.append(f"| `{field.name}` | `{field.default!r}` | {help_text} |")
    return "\n".join(lines)
