"""Long texts of different genres that every CPython install ships: the documents of the bench's prompt set and batches.

* ``reference``: the Python language reference (``pydoc_data.topics``, a technical manual);
* ``code``: the source of the standard library's ``argparse`` module (code and docstrings);
* ``guide``: IDLE's user guide (``idlelib/help.html`` with its markup removed, a how-to manual);
* ``changelog``: IDLE's release notes (``idlelib/NEWS.txt``, short change entries).

Nothing is downloaded, so the prompts are offline and the same text for a given CPython version.

Example:
    >>> sorted(HAYSTACKS)
    ['changelog', 'code', 'guide', 'reference']
    >>> len(haystack_text("guide")) > 30_000
    True
"""

from __future__ import annotations

import html.parser
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path

from .documents import DocumentError, python_reference_text


def stdlib_file(relative: str) -> str:
    """The text of a file of this Python install's standard library, ``relative`` to its directory.

    Raises:
        DocumentError: the file is missing or unreadable.

    Example:
        >>> "argparse" in stdlib_file("argparse.py")
        True
    """
    path = Path(sysconfig.get_paths()["stdlib"]) / relative
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise DocumentError(
            f"the file {path} is missing from this Python install ({type(err).__name__}); use a document "
            "every CPython ships in pydoc_data (the 'reference' haystack, the 'reference' prompt)."
        ) from None


class _TextOnly(html.parser.HTMLParser):
    """The text of an HTML page outside ``<script>`` and ``<style>``."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        self.hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self.hidden -= tag in ("script", "style")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def html_text(page: str) -> str:
    """The visible text of an HTML page, runs of blank lines folded into one.

    Example:
        >>> html_text("<p>Save</p>\\n\\n\\n<style>x{}</style><p>Close</p>")
        'Save\\n\\nClose'
    """
    parser = _TextOnly()
    parser.feed(page)
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


HAYSTACKS: dict[str, Callable[[], str]] = {
    "reference": python_reference_text,
    "code": lambda: stdlib_file("argparse.py"),
    "guide": lambda: html_text(stdlib_file("idlelib/help.html")),
    "changelog": lambda: stdlib_file("idlelib/NEWS.txt"),
}
"""Haystack name -> a function returning its text."""


def haystack_text(name: str, start: float = 0.0) -> str:
    """The text of haystack ``name`` from the line at fraction ``start`` of it.

    Args:
        name: one of :data:`HAYSTACKS`.
        start: where the returned text begins, as a fraction of the characters (moved to the next line).

    Raises:
        DocumentError: an unknown name, a start outside ``[0, 1)``, or a file missing from the install.

    Example:
        >>> haystack_text("reference", 0.5)[:1] != ""
        True
    """
    if name not in HAYSTACKS:
        raise DocumentError(f"unknown haystack {name!r}: choose one of {sorted(HAYSTACKS)}.")
    if not 0.0 <= start < 1.0:
        raise DocumentError(f"haystack start {start} is outside [0, 1).")
    text = HAYSTACKS[name]()
    offset = int(start * len(text))
    newline = text.find("\n", offset)
    return text[newline + 1 if offset and newline >= 0 else offset :]
