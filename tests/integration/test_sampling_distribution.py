"""Sampled TriForce output has the distribution of plain sampled ``generate()``: an empirical two-sample test.

TriForce claims *lossless* sampling: level 0 (no drafter, n-gram lookup or a tiny draft model) is verified
by level 1 (the target's weights over a sparse retrieval view of the KV cache), and level 1 by level 2 (the
target over its full cache), each with exact speculative sampling (accept with ``min(1, p/q)``, resample
from the residual ``norm(max(p - q, 0))`` on rejection). The unit tests check that rule on fixed
distributions; this module checks the whole pipeline end to end, logits processors included.

Setup. A tiny random Llama (2 layers) with an 8-token vocabulary and a 100-token random prompt, four times
the 32-token retrieval budget (chunk 4, recent window 8, re-selection every 2 tokens), so level 1 attends
to a genuinely sparse view and its distribution differs from level 2's: every case asserts that level 2
rejected some level-1 drafts (a rejection has probability zero when ``p == q``), i.e. that the residual
resampling path ran, that some rounds were accepted whole (level 2's bonus token ran), and, with a level-0
drafter, that level 1 rejected some level-0 drafts too.

Positions. Each run generates ``NEW_TOKENS = 6``: the prefill's token, then one whole round, in which level 1
drafts ``gamma2 = 4`` tokens (its steps verify ``gamma1 = 2`` level-0 drafts and add level 1's own bonus token, so
new tokens 2 to 5 mix level-0 drafts, level-1 residuals and level-1 bonus tokens) and level 2 verifies them and
adds its own bonus as new token 6 when all four are accepted. The test histograms every one of these positions:
two windows of three tokens each (``WINDOWS``, 512 continuations each), so a wrong rule at any depth of the round
(the deepest draft, either level's bonus token) moves some window's distribution.

Test. ``NUM_SAMPLES`` TriForce runs (``torch.manual_seed(i)`` for run ``i``) against ``NUM_SAMPLES`` draws
of plain ``generate()`` (one ``num_return_sequences=NUM_SAMPLES`` call under another seed: independent rows
of plain sampling, five times faster than as many calls), compared by Pearson's chi-square test of
homogeneity on the 2 x K table of each window's continuation counts (``scipy.stats.chi2_contingency``;
continuations with an expected count below 5 are pooled into one bin: ``tests/support/homogeneity.py``).

Significance level. ``ALPHA = 1e-3`` per case, split over the windows (Bonferroni: each window at
``ALPHA / len(WINDOWS)``): a case fails when any window's p-value is below that. Seeds are fixed so the test is
deterministic, and were never moved after a failure (a failing draw is answered with more samples, not other
seeds); ``ALPHA`` is the chance that a correct sampler fails for an unlucky choice of seeds, small enough for the
cases here (about 2% for all of them together) and yet, at this sample size, large enough to catch the mistakes
that matter. The power checks show that, at the same ``NUM_SAMPLES`` and split: the test rejects a TriForce whose
verification skips residual resampling (on a rejection it draws from ``p`` instead of ``norm(max(p - q, 0))``), a
sample whose temperature is off by 0.25, and a TriForce that draws each bonus token (after a level's drafts are
all accepted) from the distribution of the position before it, an error confined to the rounds accepted whole.

Where. This module tests the logits processors and drafters on level 0 -> 1 -> 2 rounds and holds the power checks;
``test_sampling_paths.py`` runs the same test on the other paths (fixed-shape steps, token trees, other schedules,
batches), with the machinery shared in ``tests/support/sampled_runs.py``. Paths that change where the cache lives
or what was prefilled, not what is computed, are tested by equality instead: a sampled call with the cache offloaded
(``test_offload.py``) or from a prefilled cache (``test_cache_reuse.py``) gives, seed for seed, the very tokens of
the same call without, which with this module's cases makes it distributed like plain ``generate()``.
"""

from __future__ import annotations

import math

import pytest
import torch

import hf_triforce
import hf_triforce.hierarchy.judge
import hf_triforce.sampling
from tests.support.sampled_runs import (
    EOS_PROCESSORS,
    NUM_SAMPLES,
    VOCAB,
    WINDOW_ALPHA,
    check_paths,
    detected,
    same_distribution,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_intra_op_thread")]

# Each logits processor at least once, each drafter at least once, three-level cases with top-k and top-p, and
# processors that read earlier tokens or the length (repetition penalty, no-repeat n-grams, a minimum length with
# EOS) with both kinds of drafter. "auto" is given the draft model, so it resolves to "model". The draft model's
# 40-token StreamingLLM cache is smaller than the prompt, so level 0 drafts from sinks + a recent window.
CASES = [
    pytest.param({"temperature": 0.7}, "none", id="temperature0.7-none"),
    pytest.param({"temperature": 1.3}, "model", id="temperature1.3-model"),
    pytest.param({"top_k": 3}, "ngram", id="top_k3-ngram"),
    pytest.param({"top_p": 0.8}, "model", id="top_p0.8-model"),
    pytest.param({"temperature": 1.3, "top_k": 5, "top_p": 0.9}, "auto", id="temperature1.3-top_k5-top_p0.9-auto"),
    pytest.param({"repetition_penalty": 1.5}, "model", id="repetition_penalty1.5-model"),
    pytest.param({"no_repeat_ngram_size": 3, "temperature": 1.2}, "ngram", id="no_repeat_ngram3-ngram"),
    pytest.param(EOS_PROCESSORS, "model", id="min_new_tokens3-eos-model"),
]


def test_tiny_model_is_non_degenerate(sampler):
    """The target's next-token distribution is neither near one-hot nor near uniform.

    Near one-hot, almost every continuation would be the same and no test could tell samplers apart;
    near uniform, every level would agree and no draft would be rejected. Both would make the
    distribution test vacuous.
    """
    with torch.no_grad():
        probs = sampler.target(input_ids=sampler.prompt).logits[0, -1].float().softmax(-1)
    entropy = float(-(probs * probs.log()).sum())
    assert 0.5 * math.log(VOCAB) < entropy < 0.95 * math.log(VOCAB), (entropy, probs.tolist())
    assert float(probs.max()) < 0.6, probs.tolist()


@pytest.mark.parametrize("processors, drafter", CASES)
def test_sampled_triforce_matches_plain_generate(sampler, processors, drafter):
    """Continuations sampled with TriForce and with plain ``generate()`` pass the homogeneity test on every window."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter)
    same_distribution(plain, got, f"TriForce sampling ({drafter=}, {processors}; level totals {totals})")
    check_paths(totals, drafter)
    assert totals["retrieval_refreshes"] > NUM_SAMPLES, totals


def _draw_from_target(target_probs, draft_probs, token=None):
    """A wrong residual: resample from the verifier's ``p`` itself, ignoring what the draft proposed."""
    return target_probs


def test_power_against_skipped_residual_resampling(sampler, monkeypatch):
    """The same test rejects TriForce without residual resampling (on a rejection it draws from ``p``).

    That sampler over-weights tokens the drafter proposes too often. The three-level top-p case is used:
    the 1-layer draft model's ``q`` differs enough from level 1's ``p`` that the bias is large at this
    ``NUM_SAMPLES`` (level 2 alone, with ``drafter="none"``, verifies a ``q`` close to its ``p``).
    """
    processors, drafter = {"top_p": 0.8}, "model"
    monkeypatch.setattr(hf_triforce.sampling, "residual_distribution", _draw_from_target)
    wrong, totals = sampler.triforce(processors, drafter, memoize=False)
    p_value, table = detected(sampler.plain(processors), wrong)
    assert p_value < WINDOW_ALPHA, (
        f"the homogeneity test did not detect a TriForce that skips residual resampling (smallest p-value "
        f"{p_value:.3g}, {NUM_SAMPLES} samples; level totals {totals}): raise NUM_SAMPLES.\n{table}"
    )


def _bonus_from_the_position_before(verify):
    """``verify_sampled`` with an off-by-one bonus: when every draft is accepted, the bonus token is drawn from the
    verifier's distribution at the last draft's position instead of the next one (acceptances and residuals
    unchanged: the error lives only in rounds accepted whole)."""

    def wrong(draft_tokens, draft_probs, target_probs, generator=None):
        k = draft_tokens.shape[0]
        shifted = torch.cat([target_probs[:k], target_probs[k - 1 : k]]) if k else target_probs
        accepted, token = verify(draft_tokens, draft_probs, target_probs, generator)
        if accepted < k:
            return accepted, token
        return k, hf_triforce.sampling.draw(shifted[k], generator)

    return wrong


def test_power_against_a_bonus_token_from_the_wrong_position(sampler, monkeypatch):
    """The same test rejects a TriForce whose bonus tokens (level 1's after level 0's drafts, level 2's after level
    1's) come from the position before: the deepest positions of a round are tested, not only the first."""
    processors, drafter = {"temperature": 1.3}, "model"
    judge = hf_triforce.hierarchy.judge
    monkeypatch.setattr(judge, "verify_sampled", _bonus_from_the_position_before(judge.verify_sampled))
    wrong, totals = sampler.triforce(processors, drafter, memoize=False)
    p_value, table = detected(sampler.plain(processors), wrong)
    assert p_value < WINDOW_ALPHA, (
        f"the homogeneity test did not detect bonus tokens drawn from the position before (smallest p-value "
        f"{p_value:.3g}, {NUM_SAMPLES} samples; level totals {totals}): raise NUM_SAMPLES.\n{table}"
    )


def test_power_against_wrong_temperature(sampler):
    """The same test tells TriForce at temperature 0.7 from plain ``generate()`` at temperature 0.95."""
    got, _ = sampler.triforce({"temperature": 0.7}, "none")
    p_value, table = detected(sampler.plain({"temperature": 0.95}), got)
    assert p_value < WINDOW_ALPHA, (
        f"the homogeneity test did not detect a temperature off by 0.25 (smallest p-value {p_value:.3g}, "
        f"{NUM_SAMPLES} samples): raise NUM_SAMPLES.\n{table}"
    )
