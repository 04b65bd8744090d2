"""Griffe extension: adapt hf_triforce's docstrings (google style, Sphinx roles) to mkdocstrings' markdown.

* A singular ``Example:`` header (accepted by Napoleon) becomes ``Examples:``, which griffe parses
  into doctest code blocks; otherwise the ``>>>`` lines would render as prose.
* Sphinx roles such as ``:func:`enable``` or ``:class:`~hf_triforce.RetrievalCache``` become code
  spans (``enable``, ``RetrievalCache``: a ``~`` keeps the last name only); markdown has no roles.

Loaded by mkdocstrings (``mkdocs.yml``: ``extensions``), it rewrites the docstrings before they are
parsed; the source is unchanged.

Example:
    >>> _markdown("Undo :func:`enable`.\\n\\nExample:\\n    >>> 1")
    'Undo `enable`.\\n\\nExamples:\\n    >>> 1'
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc):`(~?)([\w.]+)`")


def _markdown(docstring: str) -> str:
    return _SPHINX_ROLE.sub(_code_span, _SINGULAR_EXAMPLE.sub(r"\1Examples:", docstring))


def _code_span(match: re.Match) -> str:
    """Sphinx's rule: ``~a.b.c`` shows ``c``, ``a.b.c`` shows the full path."""
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class DocstringsToMarkdown(griffe.Extension):
    """Rewrite every loaded docstring with :func:`_markdown`."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _markdown(obj.docstring.value)
