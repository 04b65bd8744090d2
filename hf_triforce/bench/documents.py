"""Long documents and the question-answering chat prompt used by the demo, the benchmarks and the examples.

The default document is the Python language reference that every CPython ships in ``pydoc_data.topics``
(~465K characters, offline).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TriForceError

if TYPE_CHECKING:  # annotations only: the CLI's --help lists the prompts without loading torch
    import torch

DEFAULT_QUESTION = (
    "Using only the document above: what is the difference between __getattr__ and __getattribute__, and when "
    "is each of them called?"
)
"""Asked about the default document: its first 7K tokens (the topics "assert" to "attribute-access" of the Python
reference) answer it, in their middle."""
DEFAULT_DOCUMENT_TOKENS = 7000


class DocumentError(TriForceError):
    """A document or question that cannot be turned into a prompt; the message says what to do."""


@dataclass
class DocumentQuestion:
    """Which model is asked which question about which document (``--model``, ``--document``, ``--question``).

    Attributes:
        model: a local model directory, or None for the embedded SmolLM2-135M-Instruct.
        document: a UTF-8 text file, or None for the Python language reference.
        question: asked after the document.
    """

    model: str | None = None
    document: str | None = None
    question: str = DEFAULT_QUESTION


def python_reference_text() -> str:
    """Return the Python language reference (~465K characters) from ``pydoc_data.topics``.

    The topics are joined in sorted key order, so the text is the same on every call for a given
    CPython version.

    Example:
        >>> text = python_reference_text()
        >>> text == python_reference_text() and len(text) > 400_000
        True
    """
    from pydoc_data.topics import topics  # about 1 MB of text: read only when the default document is used

    return "\n\n".join(topics[key] for key in sorted(topics))


def read_document(path: str | os.PathLike[str] | None) -> str:
    """The text of ``path`` (UTF-8), or the Python language reference when ``path`` is ``None``.

    Raises:
        DocumentError: the file is missing, unreadable, not UTF-8 text, or empty.

    Example:
        >>> len(read_document(None)) > 400_000
        True
    """
    if path is None:
        return python_reference_text()
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentError(f"document not found: {path}. Pass an existing text file with --document.") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DocumentError(
            f"cannot read {path} as UTF-8 text ({type(err).__name__}): pass a plain text file."
        ) from None
    if not text.strip():
        raise DocumentError(f"document {path} is empty: pass a text file with some content.")
    return text


def question_prompt(
    tokenizer,
    document: str,
    question: str = DEFAULT_QUESTION,
    document_tokens: int | None = DEFAULT_DOCUMENT_TOKENS,
    context_limit: int | None = None,
    reserve: int = 0,
) -> torch.LongTensor:
    """``[1, n]`` chat-template token ids asking ``question`` about (the start of) ``document``.

    Args:
        tokenizer: a tokenizer with a chat template.
        document: the document text.
        question: the question, placed after the document.
        document_tokens: keep at most this many tokens of the document (``None``: all of it).
        context_limit: the model's context length; the document is cut so that the prompt plus
            ``reserve`` tokens fit.
        reserve: tokens to leave free for the answer.

    Raises:
        DocumentError: no chat template, or the question alone does not fit.

    Example:
        >>> ids = question_prompt(tok, read_document(None), document_tokens=7000)  # doctest: +SKIP
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DocumentError(
            "the tokenizer has no chat template, so a question cannot be asked: use an instruction-tuned model "
            "whose tokenizer defines one (tokenizer.chat_template)."
        )
    overhead = _encode(tokenizer, "", question).shape[1]
    room = None if context_limit is None else context_limit - reserve - overhead
    if room is not None and room <= 0:
        raise DocumentError(
            f"the question and the {reserve} answer tokens need {overhead + reserve} tokens, more than the model's "
            f"context of {context_limit}: shorten the question or lower --max-new-tokens."
        )
    limit = min(x for x in (document_tokens, room) if x is not None) if (document_tokens or room) else None
    ids = _encode(tokenizer, _truncate(tokenizer, document, limit), question)
    while room is not None and ids.shape[1] + reserve > context_limit:  # re-tokenizing a cut text can grow it
        limit -= ids.shape[1] + reserve - context_limit
        ids = _encode(tokenizer, _truncate(tokenizer, document, limit), question)
    return ids


def _truncate(tokenizer, text: str, max_tokens: int | None) -> str:
    if max_tokens is None:
        return text
    ids = tokenizer(text[: max_tokens * 8], add_special_tokens=False).input_ids[:max_tokens]
    return tokenizer.decode(ids)


def _encode(tokenizer, document: str, question: str) -> torch.LongTensor:
    content = f"{document}\n\nQuestion: {question}" if document else f"Question: {question}"
    messages = [{"role": "user", "content": content}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    return out["input_ids"]
