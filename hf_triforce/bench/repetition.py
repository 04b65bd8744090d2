"""How much of an answer repeats itself: the demo's measure of a generation loop."""

from __future__ import annotations

from collections.abc import Sequence

LOOP_NGRAM = 8
"""n-gram length of :func:`repeated_fraction`: 8 tokens repeat by chance rarely, a loop repeats them all."""
LOOP_FRACTION = 0.25
"""An answer whose :func:`repeated_fraction` exceeds this loops (the demo's "a loop"; the bench leaves it out of
its summaries, since n-gram drafting predicts a loop perfectly)."""
DEFAULT_REPETITION_PENALTY = 1.2
"""The demo's and the bench's penalty on the answer's own tokens (the value the CTRL paper suggests, as
transformers' docs quote): a small model's long answers otherwise drift into a loop."""


def repeated_fraction(tokens: Sequence[int], n: int = LOOP_NGRAM) -> float:
    """The fraction of the ``n``-grams of ``tokens`` that already occurred earlier in ``tokens``.

    0 for an answer that never repeats a span of ``n`` tokens; close to 1 for one that loops from its start.
    A sequence shorter than ``n`` has no ``n``-gram and scores 0.

    Args:
        tokens: token ids of the answer (``sequences[0, prompt:].tolist()``).
        n: the span length.

    Example:
        >>> repeated_fraction([1, 2, 3, 4, 5, 6], n=2)
        0.0
        >>> repeated_fraction([1, 2, 1, 2, 1, 2], n=2)
        0.6
    """
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    for gram in grams:
        repeats += gram in seen
        seen.add(gram)
    return repeats / len(grams) if grams else 0.0


def loops(tokens: Sequence[int]) -> bool:
    """Whether an answer loops: more than :data:`LOOP_FRACTION` of its :data:`LOOP_NGRAM`-grams repeat.

    Example:
        >>> loops([1, 2, 3, 4, 5, 6, 7, 8] * 4), loops(list(range(40)))
        (True, False)
    """
    return repeated_fraction(tokens) > LOOP_FRACTION
