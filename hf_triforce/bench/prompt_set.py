"""The benchmark's prompts: a question about each of seven offline documents of different genres.

A speedup counts on text nobody tuned for, and speculation's speed depends on the text: an n-gram drafter
predicts code and tables better than prose, and an answer that loops is predicted perfectly. So
``hf-triforce bench`` and the demo measure a fixed set of documents every CPython install ships, one per genre,
each with a question its first 7K tokens answer:

============  ===========================================================================================
name          document
============  ===========================================================================================
prose         Python's history and license (``LICENSE.txt``), IDLE's history (``idlelib/HISTORY.txt``) and
              the email package's design notes (``email/architecture.rst``), one after the other
reference     the Python language reference (``pydoc_data.topics``) from its ``raise`` topic on, not the
              demo's ``__getattr__`` region the project measured most
code          the standard library's ``argparse`` module
guide         IDLE's user guide (``idlelib/help.html``, markup removed)
changelog     IDLE's release notes (``idlelib/NEWS.txt``)
table         the HTML5 named character references of ``html.entities``, one ``name | character | code
              points`` row each
transcript    interactive Python sessions with commentary (the doctest tutorials of
              ``test/test_generators.py``): the nearest offline thing to a chat log
============  ===========================================================================================

Nothing is downloaded, so the prompts are the same for a given CPython version on every machine.

Example:
    >>> [p.name for p in BENCH_PROMPTS]
    ['prose', 'reference', 'code', 'guide', 'changelog', 'table', 'transcript']
    >>> len(bench_prompt("table").text()) > 30_000
    True
"""

from __future__ import annotations

import ast
import html.entities
from collections.abc import Callable
from dataclasses import dataclass

from .documents import DocumentError, read_document
from .haystacks import haystack_text, stdlib_file


def _prose() -> str:
    parts = ("LICENSE.txt", "idlelib/HISTORY.txt", "email/architecture.rst")
    return "\n\n".join(stdlib_file(p) for p in parts)


def _entity_table() -> str:
    rows = ["name | character | code points"]
    for name, char in sorted(html.entities.html5.items()):
        points = " ".join(f"U+{ord(c):04X}" for c in char)
        rows.append(f"&{name} | {char!r} | {points}")
    return "\n".join(rows)


def _sessions() -> str:
    """The module-level strings of ``test/test_generators.py`` that hold an interactive session."""
    tree = ast.parse(stdlib_file("test/test_generators.py"))
    strings = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    return "\n\n".join(s.strip("\n") for s in strings if ">>>" in s)


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: a document and a question about its first 7K tokens.

    Attributes:
        name: short name (the genre), as the bench's rows and ``--prompts`` call it.
        genre: what kind of text the document is.
        question: asked after the document.
        source: where the document comes from (for the report).
    """

    name: str
    genre: str
    question: str
    source: str
    _text: Callable[[], str]

    def text(self) -> str:
        """The document's text (read from this Python install).

        Raises:
            DocumentError: a file of the document is missing from this install.
        """
        return self._text()


BENCH_PROMPTS: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "prose",
        "prose (history, licence, design notes)",
        "Using only the text above: who created Python and where, and how did the license under which Python is "
        "released change over the years?",
        "LICENSE.txt + idlelib/HISTORY.txt + email/architecture.rst",
        _prose,
    ),
    BenchPrompt(
        "reference",
        "reference manual",
        "Using only the document above: what does the raise statement do with the from clause, and how are "
        "slicings of a sequence evaluated?",
        "pydoc_data.topics from 'raise'",
        lambda: haystack_text("reference", 0.55),
    ),
    BenchPrompt(
        "code",
        "source code",
        "Using only the code above: how does HelpFormatter wrap and indent the help text of each argument, and "
        "how is the usage line built?",
        "argparse.py",
        lambda: haystack_text("code"),
    ),
    BenchPrompt(
        "guide",
        "user guide",
        "Using only the guide above: how do I run a module I am editing in IDLE, and what happens in the Shell "
        "when it restarts?",
        "idlelib/help.html",
        lambda: haystack_text("guide"),
    ),
    BenchPrompt(
        "changelog",
        "changelog",
        "Using only the release notes above: what changed in IDLE's Shell and in its Save As dialogs in the "
        "most recent releases?",
        "idlelib/NEWS.txt",
        lambda: haystack_text("changelog"),
    ),
    BenchPrompt(
        "table",
        "table",
        "Using only the table above: which entity names give the character 'Á', and what are the code points of "
        "the entities for the Greek capital letters alpha and delta?",
        "html.entities.html5",
        _entity_table,
    ),
    BenchPrompt(
        "transcript",
        "session transcript",
        "Using only the sessions above: what happens when a generator function reaches a return statement, and "
        "how does the session show it?",
        "test/test_generators.py (its doctest sessions)",
        _sessions,
    ),
)
"""The bench's prompts, one per genre, in the order the bench runs them."""


def bench_prompt(name: str) -> BenchPrompt:
    """The prompt of :data:`BENCH_PROMPTS` called ``name``.

    Raises:
        DocumentError: no such prompt (the message lists the names).

    Example:
        >>> bench_prompt("code").source
        'argparse.py'
    """
    for prompt in BENCH_PROMPTS:
        if prompt.name == name:
            return prompt
    raise DocumentError(f"unknown prompt {name!r}: choose from {[p.name for p in BENCH_PROMPTS]}.")


def user_prompt(document: str | None, question: str) -> BenchPrompt:
    """A prompt of the user's: ``question`` about the text file ``document`` (None: the Python reference), read now.

    Raises:
        DocumentError: the file cannot be read as text (before any model work).

    Example:
        >>> user_prompt(None, "What does assert do?").name
        'custom'
    """
    text = read_document(document)
    if document is None:
        return BenchPrompt("custom", "reference manual", question, "the Python language reference", lambda: text)
    return BenchPrompt("custom", "your document", question, str(document), lambda: text)


def prompt_record(prompt: BenchPrompt) -> dict[str, str]:
    """The JSON-ready facts of a prompt (its name, genre, source and question).

    Example:
        >>> prompt_record(bench_prompt("code"))["genre"]
        'source code'
    """
    return {"name": prompt.name, "genre": prompt.genre, "source": prompt.source, "question": prompt.question}
