"""The demo's helpers: the loop measure of an answer and the answer-only repetition penalty."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import RepetitionPenaltyLogitsProcessor

from hf_triforce.bench.repetition import repeated_fraction
from hf_triforce.hf.processors import answer_repetition_penalty, custom_processor_replaces_builtin

pytestmark = pytest.mark.unit


def test_a_loop_scores_high_and_prose_zero():
    assert repeated_fraction(list(range(40))) == 0.0
    loop = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 6  # a 10-token phrase six times
    assert repeated_fraction(loop) == pytest.approx((60 - 10 - 7) / (60 - 7))
    assert repeated_fraction([1, 2, 3], n=8) == 0.0


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 9))
def test_repeated_fraction_counts_earlier_ngrams(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    expected = sum(g in grams[:i] for i, g in enumerate(grams)) / len(grams) if grams else 0.0
    assert repeated_fraction(tokens, n) == pytest.approx(expected)


def test_answer_penalty_leaves_the_prompt_free():
    """Scores after the penalty equal a plain penalty over the answer's tokens alone."""
    kwargs = answer_repetition_penalty(1.5, prompt_length=4)
    assert kwargs["repetition_penalty"] == 1.5
    (processor,) = kwargs["logits_processor"]
    ids = torch.tensor([[0, 1, 2, 3, 4, 5]])  # prompt 0..3, answer 4, 5
    scores = torch.linspace(-2.0, 2.0, 8)[None].clone()
    expected = RepetitionPenaltyLogitsProcessor(1.5)(ids[:, 4:], scores.clone())
    assert torch.equal(processor(ids, scores.clone()), expected)
    assert torch.equal(expected[0, :4], scores[0, :4]) and not torch.equal(expected[0, 4:6], scores[0, 4:6])


def test_only_the_replacement_warning_is_dropped(caplog):
    log = logging.getLogger("transformers.generation.utils")
    with caplog.at_level(logging.WARNING, logger=log.name), custom_processor_replaces_builtin():
        log.warning("A custom logits processor ... will take precedence. Please check")
        log.warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]
    assert not any(isinstance(f, logging.Filter) and type(f).__name__ == "_Replaced" for f in log.filters)
