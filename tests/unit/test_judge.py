"""Batched judging (hf_triforce.hierarchy.judge) against the per-position processing it replaces, and the sparse
token draw (hf_triforce.sampling.draw) against the distribution it draws from.

``processed_scores`` runs the context-free tail of a processor list (temperature, top-k, top-p, ...) once over
every position of every row: each row must come out exactly as the whole list applied to that position alone
with its own context. Rows here have different lengths (some positions of different rows share a context length,
so they are processed together), and the context-dependent head (repetition penalty, a minimum length) makes
every position's result depend on its own prefix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hf_triforce.hf.processors import context_free_tail, for_row
from hf_triforce.hierarchy.judge import Drafts, judge_rows, processed_scores
from hf_triforce.sampling import draw

pytestmark = pytest.mark.unit

V = 64
HEAD = [RepetitionPenaltyLogitsProcessor(1.5), MinNewTokensLengthLogitsProcessor(10, 14, [3])]
TAIL = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)]


def _rows(lengths=(9, 10, 12), drafts=(3, 0, 5), seed: int = 0) -> list[Drafts]:
    g = torch.Generator().manual_seed(seed)
    return [
        Drafts(
            torch.randint(0, V, (n,), generator=g),
            torch.randint(0, V, (k,), generator=g),
            None,
            torch.randn(k + 1, V, generator=g) * 3,
        )  # fmt: skip
        for n, k in zip(lengths, drafts, strict=True)
    ]


def _one_by_one(lp: LogitsProcessorList, row: Drafts) -> torch.Tensor:
    context = torch.cat([row.prefix, row.tokens])
    n = row.prefix.shape[0]
    return torch.cat(
        [lp(context[None, : n + i], row.logits[i : i + 1].clone()) for i in range(row.tokens.shape[0] + 1)]
    )


@pytest.mark.parametrize(
    "processors",
    [HEAD + TAIL, TAIL, HEAD, [], [TemperatureLogitsWarper(0.7), RepetitionPenaltyLogitsProcessor(1.3)]],
    ids=["head+tail", "tail", "head", "none", "warper-then-penalty"],
)
def test_processed_scores_equal_per_position_processing(processors):
    lp = LogitsProcessorList(processors)
    rows = _rows()
    got = processed_scores([lp] * len(rows), rows)
    for row, scores in zip(rows, got, strict=True):
        torch.testing.assert_close(scores, _one_by_one(lp, row), rtol=0, atol=0)


def test_processed_scores_with_length_only_head_and_a_large_vocabulary_equal_per_position_processing():
    """The path generate()'s usual list takes (minimum lengths, then temperature, top-k 50, top-p): the lengths for
    every position at once and top-p sorting only the finite scores, still exactly as position by position."""
    head = [MinLengthLogitsProcessor(12, [3]), MinNewTokensLengthLogitsProcessor(9, 4, [3, 5])]
    lp = LogitsProcessorList(head + [TemperatureLogitsWarper(0.6), TopKLogitsWarper(50), TopPLogitsWarper(0.9)])
    for seed in range(4):
        rows = [Drafts(r.prefix, r.tokens, None, torch.randn(r.logits.shape[0], 2048) * 4) for r in _rows(seed=seed)]
        for row, scores in zip(rows, processed_scores([lp] * len(rows), rows), strict=True):
            torch.testing.assert_close(scores, _one_by_one(lp, row), rtol=0, atol=0)
            assert scores[: max(0, 12 - row.prefix.shape[0]), 3].eq(float("-inf")).all()


def test_context_free_tail_counts_only_the_trailing_context_free_processors():
    assert context_free_tail(LogitsProcessorList(HEAD + TAIL)) == 3
    assert context_free_tail(LogitsProcessorList(TAIL + HEAD)) == 0
    assert context_free_tail(LogitsProcessorList([NoRepeatNGramLogitsProcessor(2), TopKLogitsWarper(5)])) == 1

    class MyTopK(TopKLogitsWarper):  # a subclass may read input_ids: processed per position
        pass

    assert context_free_tail(LogitsProcessorList([MyTopK(5)])) == 0


def test_judge_rows_greedy_equals_argmax_of_each_row():
    rows = _rows()
    lp = LogitsProcessorList(HEAD)
    for row, (accepted, token, _) in zip(rows, judge_rows([lp] * 3, False, rows), strict=True):
        choice = _one_by_one(lp, row).argmax(-1)
        k = row.tokens.shape[0]
        mismatch = (row.tokens != choice[:k]).nonzero()
        expected = int(mismatch[0, 0]) if mismatch.numel() else k
        assert (accepted, token) == (expected, int(choice[expected]))


def test_for_row_passes_each_row_its_batch_index():
    seen = []
    lp = LogitsProcessorList([PrefixConstrainedLogitsProcessor(lambda b, ids: seen.append(b) or [b], num_beams=2)])
    rows = [for_row(lp, b) for b in range(4)]  # num_beams=2: two rows per batch index, as transformers counts
    for row in rows:
        out = row(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, V))
        assert int(out.argmax()) == seen[-1]
    assert seen == [0, 0, 1, 1]


@pytest.mark.parametrize("support", [5, V], ids=["sparse", "full"])
def test_draw_matches_its_distribution_chisquare(support):
    """20000 draws from p (zeros outside ``support`` entries) follow p; nothing outside the support comes out."""
    g = torch.Generator().manual_seed(7)
    p = torch.zeros(V, dtype=torch.float64)
    p[torch.randperm(V, generator=g)[:support]] = torch.rand(support, generator=g, dtype=torch.float64) + 0.1
    counts = np.bincount([draw(p.float(), g) for _ in range(20_000)], minlength=V)
    keep = p.numpy() > 0
    assert counts[~keep].sum() == 0
    expected = p.numpy()[keep] / p.numpy()[keep].sum() * counts.sum()
    assert chisquare(counts[keep], expected).pvalue > 1e-3
