"""mkdocs hook: replace ``<!-- triforce-config-table -->`` with a table of every ``TriForceConfig`` field.

The table (name, default, what it does) is built from the dataclass fields and the class docstring's ``Args``
(``hf_triforce.config.field_docs``), so the documentation cannot drift from the code.
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
    """Markdown table of ``TriForceConfig``'s fields: ``| field | default | what it does |``."""
    from hf_triforce import TriForceConfig
    from hf_triforce.config import field_docs

    docs = field_docs()
    lines = ["| field | default | what it does |", "|---|---|---|"]
    for field in dataclasses.fields(TriForceConfig):
        lines.append(f"| `{field.name}` | `{field.default!r}` | {_cell(docs[field.name])} |")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` on one line, its pipes escaped for a table cell."""
    return " ".join(text.split()).replace("|", "\\|")
