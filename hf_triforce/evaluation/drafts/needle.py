"""Needle tasks from real text: a distinctive passage placed at a chosen depth of a long document.

The prompt (through the tokenizer's chat template) is the document with the passage inserted at a
token depth, then a request whose correct answer copies the passage. A sparse view that misses the
passage's chunks cannot reproduce the answer, which makes the task a direct test of retrieval: the
recent window of a StreamingLLM cache only holds the end of the document.

Example:
    >>> prompt = build_needle_prompt(tokenizer, read_document(None), 4096, depth=0.5)  # doctest: +SKIP
    >>> prompt.input_ids.shape[1] <= 4096, round(prompt.depth, 2)  # doctest: +SKIP
    (True, 0.5)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..common.documents import DocumentError

# A record made of real words that appears nowhere in the Python reference, so the answer can only come
# from the inserted passage.
DEFAULT_NEEDLE = (
    "Harbour Archive registry entry: the lighthouse keeper is Marisol Quenby, her grey cat is called Biscuit, "
    "the spare key hangs behind the copper kettle in the north tower, the password for the radio room is violet "
    "anchor forty-two, the supply boat arrives every second Thursday with lamp oil and oranges, and the logbook "
    "is kept in a tin box under the seventh stair, wrapped in a green scarf that belonged to the previous keeper, "
    "Tobias Wren."
)
DEFAULT_NEEDLE_REQUEST = (
    "Somewhere in the document above there is a Harbour Archive registry entry. Copy that registry entry "
    "exactly, word for word."
)


@dataclass
class NeedlePrompt:
    """A needle prompt and where its parts are.

    Attributes:
        input_ids: ``[1, n]`` chat-template token ids.
        needle_span: ``(start, end)`` token indices of the passage in ``input_ids``.
        document_span: ``(start, end)`` token indices of the document (passage included).
        requested_depth: the depth asked for, in ``[0, 1]``.
        needle_ids: ``[k]`` the passage's token ids as they appear in ``input_ids``.
        cue: the text that starts the assistant's answer (the end of the prompt).
    """

    input_ids: torch.LongTensor
    needle_span: tuple[int, int]
    document_span: tuple[int, int]
    requested_depth: float
    needle_ids: torch.LongTensor
    cue: str = ""

    @property
    def depth(self) -> float:
        """Fraction of the document's own tokens (passage excluded) that come before the passage."""
        before = self.needle_span[0] - self.document_span[0]
        total = (self.document_span[1] - self.document_span[0]) - (self.needle_span[1] - self.needle_span[0])
        return before / max(total, 1)


def build_needle_prompt(
    tokenizer,
    document: str,
    context_tokens: int,
    depth: float,
    needle: str = DEFAULT_NEEDLE,
    request: str = DEFAULT_NEEDLE_REQUEST,
    cue_words: int = 8,
) -> NeedlePrompt:
    """The document cut to fit ``context_tokens`` with ``needle`` inserted at token ``depth`` of it.

    The passage goes between two blank lines after ``round(depth * D)`` of the ``D`` document tokens; the
    request follows the document as in :func:`hf_triforce.evaluation.common.documents.question_prompt`, and the
    assistant's answer is started with the passage's first ``cue_words`` words (the cue, whitespace kept). Small
    models asked to copy a passage without a cue tend to answer with boilerplate; with it, the correct
    continuation is the rest of the passage, copied from the middle of the document (an induction task).

    Args:
        tokenizer: a fast tokenizer with a chat template (offsets locate the passage).
        document: the long text.
        context_tokens: the prompt's length is at most this.
        depth: where the passage goes, ``0.0`` (start) to ``1.0`` (end of the document).
        needle: the passage.
        request: the instruction after the document; its answer should copy the passage.
        cue_words: words of the passage that start the answer (0: none).

    Returns:
        a :class:`NeedlePrompt`.

    Raises:
        DocumentError: no chat template, depth outside ``[0, 1]``, or a context too short for the passage.

    Example:
        >>> p = build_needle_prompt(tok, text, 4096, 0.25)  # doctest: +SKIP
        >>> abs(p.depth - 0.25) < 0.01  # doctest: +SKIP
        True
    """
    _check_inputs(tokenizer, depth)
    cue = passage_prefix(needle, cue_words)
    overhead = len(_encode(tokenizer, _content("", needle, "", request), cue)[0])
    room = context_tokens - overhead
    if room <= 0:
        raise DocumentError(
            f"a needle prompt needs more than {overhead} tokens for the passage and the request; raise the "
            f"context (got {context_tokens} tokens)."
        )
    doc_ids = tokenizer(document[: room * 12], add_special_tokens=False).input_ids[:room]
    while True:
        split = round(depth * len(doc_ids))
        before, after = tokenizer.decode(doc_ids[:split]), tokenizer.decode(doc_ids[split:])
        ids, offsets, text = _encode(tokenizer, _content(before, needle, after, request), cue)
        excess = len(ids) - context_tokens
        if excess <= 0 or not doc_ids:
            break
        doc_ids = doc_ids[: max(0, len(doc_ids) - excess)]  # re-tokenizing the cut text can grow it
    start = text.index(_content(before, needle, after, request))
    needle_chars = (start + len(before) + 2, start + len(before) + 2 + len(needle))
    document_chars = (start, start + len(_content(before, needle, after, "")) - len("\n\nQuestion: "))
    needle_span = _token_span(offsets, needle_chars)
    document_span = _token_span(offsets, document_chars)
    input_ids = torch.tensor([ids], dtype=torch.long)
    needle_ids = input_ids[0, slice(*needle_span)].clone()
    return NeedlePrompt(input_ids, needle_span, document_span, depth, needle_ids, cue)


def passage_prefix(passage: str, words: int) -> str:
    r"""The passage up to the end of its ``words``-th word, whitespace kept (``""`` for 0 words).

    Example:
        >>> passage_prefix("def f(x):\n    return x", 3)
        'def f(x):\n    return'
    """
    ends = [m.end() for m in re.finditer(r"\S+", passage)][:words]
    return passage[: ends[-1]] if words > 0 and ends else ""


def needle_overlap(answer_ids: torch.Tensor, needle_ids: torch.Tensor, n: int = 4) -> float:
    """Fraction of the answer's token ``n``-grams that occur in the passage (0 for answers shorter than ``n``).

    Args:
        answer_ids: ``[m]`` generated token ids.
        needle_ids: ``[k]`` the passage's token ids.
        n: n-gram length.

    Example:
        >>> needle_overlap(torch.tensor([1, 2, 3, 4, 9]), torch.tensor([0, 1, 2, 3, 4]), n=2)
        0.75
    """
    answer, needle = answer_ids.tolist(), needle_ids.tolist()
    grams = {tuple(needle[i : i + n]) for i in range(len(needle) - n + 1)}
    answer_grams = [tuple(answer[i : i + n]) for i in range(len(answer) - n + 1)]
    if not answer_grams:
        return 0.0
    return sum(g in grams for g in answer_grams) / len(answer_grams)


def needle_coverage(answer_ids: torch.Tensor, needle_ids: torch.Tensor, n: int = 4) -> float:
    """Fraction of the passage's token ``n``-grams that the answer reproduces.

    Example:
        >>> needle_coverage(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3, 4]), n=2)
        0.5
    """
    return needle_overlap(needle_ids, answer_ids, n)


def _check_inputs(tokenizer, depth: float) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise DocumentError(
            "the tokenizer has no chat template, so a needle request cannot be asked: use an instruction-tuned "
            "model whose tokenizer defines one (tokenizer.chat_template)."
        )
    if not 0.0 <= depth <= 1.0:
        raise DocumentError(f"needle depth {depth} is outside [0, 1]: pass depths such as 0.1,0.5,0.9.")
    if not getattr(tokenizer, "is_fast", False):
        raise DocumentError("needle prompts need a fast tokenizer (token offsets); load it with use_fast=True.")


def _content(before: str, needle: str, after: str, request: str) -> str:
    return f"{before}\n\n{needle}\n\n{after}\n\nQuestion: {request}"


def _encode(tokenizer, content: str, cue: str) -> tuple[list[int], list[tuple[int, int]], str]:
    """Chat-template token ids of one user message and the answer's cue, their character offsets, the text."""
    messages = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) + cue
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"], text


def _token_span(offsets: list[tuple[int, int]], chars: tuple[int, int]) -> tuple[int, int]:
    """``(first, last + 1)`` of the tokens overlapping the character range ``chars``."""
    inside = [i for i, (a, b) in enumerate(offsets) if b > chars[0] and a < chars[1] and b > a]
    if not inside:
        raise DocumentError("the passage vanished from the tokenized prompt; use a passage of plain words.")
    return inside[0], inside[-1] + 1
