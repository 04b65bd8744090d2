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
"""

from __future__ import annotations

import contextlib
import copy
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import hf_triforce
import hf_triforce.hierarchy.judge
import hf_triforce.sampling
from hf_triforce import TriForceConfig
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs
from hf_triforce.hierarchy.planner import Plan, Planner
from tests.support.homogeneity import describe, homogeneity_test, window_codes

pytestmark = pytest.mark.integration

ALPHA = 1e-3
"""Significance level of every two-sample test (see the module docstring)."""
NUM_SAMPLES = 1000
"""Draws per sample (TriForce and plain, each)."""
WORKERS = 1 if "PYTEST_XDIST_WORKER" in os.environ else min(2, os.cpu_count() or 1)
"""Processes that draw a sample's TriForce runs. Each run is seeded on its own (``torch.manual_seed(i)``), so the
runs split over forked workers, one thread each, give the very sample one process gives: run alone, this module
takes half the time on 2 cores. 1 in a pytest-xdist worker (``make test``), whose workers already share the cores."""

VOCAB = 8
PROMPT_LENGTH = 100
NEW_TOKENS = 6
"""The prefill's token and one whole round: ``gamma2`` level-1 drafts and level 2's bonus token (module docstring)."""
WINDOWS = ((0, 1, 2), (3, 4, 5))
"""New-token positions tested jointly, window by window: every position of the first round is in one."""
WINDOW_ALPHA = ALPHA / len(WINDOWS)
"""Each window's significance level: a case's family-wise level stays ``ALPHA``."""
EOS_PROCESSORS = {"min_new_tokens": 3, "eos_token_id": VOCAB - 1, "pad_token_id": VOCAB - 1}
"""A minimum length: EOS is suppressed for the first three new tokens and allowed from the 4th (a processor that
reads each position's length); a sequence that ends is padded with EOS, in both samples alike."""
TRIFORCE_SEEDS = range(NUM_SAMPLES)
PLAIN_SEED = 1_000_003  # outside TRIFORCE_SEEDS: the two samples are independent
SPARSE = dict(
    retrieval_budget=32,
    chunk_size=4,
    recent_window=8,
    refresh_every=2,
    gamma1=2,
    gamma2=4,
    draft_cache_budget=40,
)

# Each logits processor at least once, each drafter at least once, three-level cases with top-k and top-p, and
# processors that read earlier tokens or the length (repetition penalty, no-repeat n-grams, a minimum length with
# EOS) with both kinds of drafter. "auto" is given the draft model, so it resolves to "model". The draft model's
# 40-token StreamingLLM cache is smaller than the prompt, so level 0 drafts from sinks + a recent window.
CASES = [
    pytest.param({"temperature": 0.7}, "none", id="temperature0.7-none"),
    pytest.param({"temperature": 1.3}, "model", id="temperature1.3-model"),
    pytest.param({"top_k": 3}, "ngram", id="top_k3-ngram"),
    pytest.param({"temperature": 0.9, "top_k": 4}, "ngram", id="temperature0.9-top_k4-ngram"),
    pytest.param({"top_p": 0.8}, "model", id="top_p0.8-model"),
    pytest.param({"temperature": 1.3, "top_k": 5, "top_p": 0.9}, "auto", id="temperature1.3-top_k5-top_p0.9-auto"),
    pytest.param({"repetition_penalty": 1.5}, "model", id="repetition_penalty1.5-model"),
    pytest.param({"no_repeat_ngram_size": 3, "temperature": 1.2}, "ngram", id="no_repeat_ngram3-ngram"),
    pytest.param(EOS_PROCESSORS, "model", id="min_new_tokens3-eos-model"),
]


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Run this module with one intra-op thread, restoring the previous count afterwards.

    The models are tiny, so thread synchronization dominates every forward: on a shared 2-core machine
    two threads made a TriForce call 10-20x slower than one.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class Sampler:
    """Draws (and memoizes, so cases and power checks can share them) plain and TriForce samples.

    A sample is a ``[NUM_SAMPLES, NEW_TOKENS]`` int array of new tokens (a sequence that stopped at EOS padded
    with EOS, as plain ``generate()`` pads it); :func:`window_codes` reads each window of it as continuation codes.
    The global RNG state is restored after each sample.
    """

    def __init__(self, target, draft, prompt: torch.LongTensor) -> None:
        self.target, self.draft, self.prompt = target, draft, prompt
        self._plain: dict[tuple, np.ndarray] = {}
        self._triforce: dict[tuple, tuple[np.ndarray, dict[str, int]]] = {}

    def codes(self, sequences: torch.LongTensor) -> np.ndarray:
        """``[N, NEW_TOKENS]`` new tokens of ``[N, prompt + <= NEW_TOKENS]`` sequences (short ones padded with EOS)."""
        tokens = sequences[:, self.prompt.shape[1] :]
        if tokens.shape[1] < NEW_TOKENS:
            tokens = torch.nn.functional.pad(tokens, (0, NEW_TOKENS - tokens.shape[1]), value=VOCAB - 1)
        return tokens.numpy()

    def plain(self, processors: dict) -> np.ndarray:
        """``NUM_SAMPLES`` independent continuations of plain sampled ``generate()``."""
        key = tuple(sorted(processors.items()))
        if key not in self._plain:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(PLAIN_SEED)
                sequences = self.target.generate(
                    self.prompt,
                    max_new_tokens=NEW_TOKENS,
                    do_sample=True,
                    num_return_sequences=NUM_SAMPLES,
                    **processors,
                )
            self._plain[key] = self.codes(sequences)
        return self._plain[key]

    def triforce(
        self,
        processors: dict,
        drafter: str,
        memoize: bool = True,
        cached: int = 0,
        schedule: str = "fixed",
        options: dict | None = None,
    ) -> tuple[np.ndarray, dict[str, int]]:
        """``NUM_SAMPLES`` TriForce continuations (run ``i`` seeded with ``i``) and the summed statistics.

        ``cached > 0``: every run is given a deep copy of a ``DynamicCache`` holding the first ``cached`` prompt
        tokens (prefilled once by a plain forward), the documented pattern for several questions on one prefix.
        ``schedule``: ``"fixed"`` (``adaptive=False``: level 0 -> 1 -> 2 every round, so both levels' rejection
        rules run), ``"adaptive"`` (the planner's choice, timing-dependent), or ``"level0"`` (the planner forced
        to level 0 -> 2 rounds: level 2 judges the drafter's tokens against its probabilities directly).
        ``options``: more ``TriForceConfig`` fields.
        """
        key = (tuple(sorted(processors.items())), drafter, cached, schedule, tuple(sorted((options or {}).items())))
        if memoize and key in self._triforce:
            return self._triforce[key]
        config = TriForceConfig(drafter=drafter, adaptive=schedule != "fixed", **SPARSE, **(options or {}))
        forced = Plan("level0", config.gamma1 + config.gamma2) if schedule == "level0" else None
        force = mock.patch.object(Planner, "plan_round", lambda planner, room=None: forced)
        with force if forced else contextlib.nullcontext():
            result = self._triforce_runs(config, processors, drafter, cached)
        if memoize:
            self._triforce[key] = result
        return result

    def _triforce_runs(self, config, processors: dict, drafter: str, cached: int):
        """The runs of ``TRIFORCE_SEEDS`` (split over :data:`WORKERS` processes): their codes and summed totals."""
        parts = _in_workers(self._runs, (config, processors, drafter, cached), TRIFORCE_SEEDS)
        totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
        totals["reused_tokens"] = parts[0][1]["reused_tokens"]  # the same in every run
        return np.concatenate([part[0] for part in parts]), totals

    def _runs(self, config, processors: dict, drafter: str, cached: int, seeds: range):
        """TriForce runs seeded with ``seeds`` (one call each): their codes and summed statistics."""
        assistant = self.draft if drafter in ("model", "auto") else None
        levels = ("level0", "level1", "level0_to_level2")
        totals = {f"{level}_{count}": 0 for level in levels for count in ("drafted", "accepted", "rejections")}
        totals["retrieval_refreshes"] = totals["reused_tokens"] = totals["levels_rounds"] = totals["tree_rounds"] = 0
        sequences = []
        prefix = self.prefilled(cached) if cached else None
        with torch.random.fork_rng(devices=[]):
            for seed in seeds:
                torch.manual_seed(seed)
                reuse = {} if prefix is None else {CACHE_ARG: copy.deepcopy(prefix)}
                sequences.append(
                    self.target.generate(
                        self.prompt,
                        max_new_tokens=NEW_TOKENS,
                        do_sample=True,
                        triforce_config=config,
                        assistant_model=assistant,
                        **processors,
                        **reuse,
                    )
                )
                stats = hf_triforce.last_stats(self.target).to_dict()
                for level in levels:
                    for count in ("drafted", "accepted", "rejections"):
                        totals[f"{level}_{count}"] += stats["levels"][level][count]
                totals["retrieval_refreshes"] += stats["retrieval_refreshes"]
                totals["tree_rounds"] += stats["tree_rounds"]
                totals["levels_rounds"] += stats["rounds"].get("levels", 0)
                totals["reused_tokens"] = stats["reused_tokens"]
        return np.concatenate([self.codes(s) for s in sequences]), totals

    def prefilled(self, length: int) -> DynamicCache:
        """A ``DynamicCache`` of the first ``length`` prompt tokens, prefilled by one plain forward."""
        cache = DynamicCache(config=self.target.config)
        with torch.no_grad():
            self.target(input_ids=self.prompt[:, :length], use_cache=True, **cache_kwargs(cache))
        return cache


_JOB: tuple | None = None
"""What the forked workers of :func:`_in_workers` run: ``(function, arguments)``, set before they fork."""


def _in_workers(function, arguments: tuple, seeds: range) -> list:
    """``function(*arguments, part)`` for :data:`WORKERS` contiguous parts of ``seeds``, in forked processes (they
    inherit the models and any patch in force), in order; in this process when there is one worker."""
    if WORKERS == 1:
        return [function(*arguments, seeds)]
    parts = [seeds[i * len(seeds) // WORKERS : (i + 1) * len(seeds) // WORKERS] for i in range(WORKERS)]
    global _JOB
    _JOB = (function, arguments)
    try:
        # A worker that dies raises BrokenProcessPool here (multiprocessing.Pool would wait for it forever).
        with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_run_job, parts))
    finally:
        _JOB = None


def _run_job(seeds: range):
    """In a worker: the job of :func:`_in_workers` for ``seeds``, on one thread."""
    torch.set_num_threads(1)
    function, arguments = _JOB
    return function(*arguments, seeds)


@pytest.fixture(scope="module")
def sampler(model_factory) -> Sampler:
    """The tiny target (TriForce-enabled), a 1-layer draft model of the same vocabulary and the prompt."""
    with torch.random.fork_rng(devices=[]):
        target = model_factory("llama_gqa", num_layers=2, seed=0, vocab_size=VOCAB)
        draft = model_factory("llama_gqa", num_layers=1, seed=100, vocab_size=VOCAB, enable=False)
    prompt = torch.randint(0, VOCAB, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
    return Sampler(target, draft, prompt)


def window_tests(first: np.ndarray, second: np.ndarray) -> list[tuple[tuple[int, ...], float, np.ndarray, list[str]]]:
    """:func:`homogeneity_test` of two ``[N, NEW_TOKENS]`` samples on each of :data:`WINDOWS`:
    ``(window, p_value, table, labels)`` each."""
    codes = [(window_codes(first, w, VOCAB), window_codes(second, w, VOCAB)) for w in WINDOWS]
    return [(w, *homogeneity_test(*pair, VOCAB, len(w))) for w, pair in zip(WINDOWS, codes, strict=True)]


def same_distribution(plain: np.ndarray, got: np.ndarray, what: str, names=("plain", "triforce")) -> None:
    """Fail with the offending window's table when any window's p-value is at or below :data:`WINDOW_ALPHA`."""
    for window, p_value, table, labels in window_tests(plain, got):
        assert p_value > WINDOW_ALPHA, (
            f"{what} is not distributed like plain generate(): chi-square p-value {p_value:.3g} <= {WINDOW_ALPHA:.3g} "
            f"(alpha {ALPHA} over {len(WINDOWS)} windows) on new tokens {[i + 1 for i in window]}, {NUM_SAMPLES} "
            f"samples each ({table.shape[1]} bins).\n" + describe(table, labels, names)
        )


def detected(plain: np.ndarray, wrong: np.ndarray) -> tuple[float, str]:
    """The smallest window p-value of a sample that must be told apart, and that window's table (for the message)."""
    window, p_value, table, labels = min(window_tests(plain, wrong), key=lambda test: test[1])
    return p_value, f"new tokens {[i + 1 for i in window]}:\n" + describe(table, labels, ("plain", "wrong"))


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


def check_paths(totals: dict[str, int], drafter: str) -> None:
    """The exact-sampling paths a case is about really ran (summed over its runs): level 1's drafts accepted and
    rejected (the residual), some rounds accepted whole (level 2's bonus), and level 0's drafts accepted and
    rejected by level 1 (or, without a drafter, none)."""
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
    assert totals["levels_rounds"] > totals["level1_rejections"], f"no round accepted whole: {totals}"
    if drafter == "none":
        assert totals["level0_drafted"] == 0, totals
    else:
        assert 0 < totals["level0_accepted"] < totals["level0_drafted"], totals


@pytest.mark.parametrize("processors, drafter", CASES)
def test_sampled_triforce_matches_plain_generate(sampler, processors, drafter):
    """Continuations sampled with TriForce and with plain ``generate()`` pass the homogeneity test on every window."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter)
    same_distribution(plain, got, f"TriForce sampling ({drafter=}, {processors}; level totals {totals})")
    check_paths(totals, drafter)
    assert totals["retrieval_refreshes"] > len(TRIFORCE_SEEDS), totals


def test_sampled_triforce_with_the_cache_offloaded(sampler):
    """``offload_kv=True``: the full cache in host storage, read through explicit copies (``test_offload.py``
    counts them): the same distribution, every level's rejection rule run."""
    processors = {"temperature": 0.9, "top_p": 0.9}
    got, totals = sampler.triforce(processors, "model", options={"offload_kv": True})
    same_distribution(sampler.plain(processors), got, f"TriForce sampling with offload_kv ({totals})")
    check_paths(totals, "model")


def test_sampled_triforce_on_fixed_shapes(sampler):
    """``cuda_graphs="eager"``: level 1's and level 0's static steps (the forwards CUDA graphs replay;
    ``test_static_steps.py`` checks they run for this family): the same distribution, every level's rejection rule
    run."""
    processors = {"temperature": 0.8, "top_k": 6}
    got, totals = sampler.triforce(processors, "model", options={"cuda_graphs": "eager"})
    same_distribution(sampler.plain(processors), got, f"TriForce sampling on fixed shapes ({totals})")
    check_paths(totals, "model")


TREE_CASES = [
    pytest.param({"temperature": 0.9, "top_k": 5}, "none", id="temperature0.9-top_k5-none"),
    pytest.param({"repetition_penalty": 1.5}, "ngram", id="repetition_penalty1.5-ngram"),
]


@pytest.mark.parametrize("processors, drafter", TREE_CASES)
def test_sampled_token_trees_match_plain_generate(sampler, processors, drafter):
    """``tree_budget=8``: level 1 drafts a token tree (candidates drawn without replacement from its distribution at
    each node), level 2 verifies it with the multi-candidate rule: the same distribution; every run's first round a
    tree, level 1's candidates both accepted and rejected. With repetition penalty each node's scores read its own
    path."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter, options={"tree_budget": 8})
    same_distribution(plain, got, f"TriForce token trees ({drafter=}, {processors}; totals {totals})")
    assert totals["tree_rounds"] >= NUM_SAMPLES, totals  # every run's first round (later ones may be plain steps)
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
    assert totals["levels_rounds"] > totals["level1_rejections"], f"no tree accepted to a leaf: {totals}"


def test_power_against_a_tree_rule_without_the_residual(sampler, monkeypatch):
    """The same test rejects token trees whose later candidates are judged against ``p`` instead of the residual."""
    processors = {"temperature": 0.9, "top_k": 5}
    original = hf_triforce.sampling.after_rejection  # p stays p; q still loses the rejected candidate
    monkeypatch.setattr(hf_triforce.sampling, "after_rejection", lambda p, q, token: (p, original(p, q, token)[1]))
    got, totals = sampler.triforce(processors, "none", memoize=False, options={"tree_budget": 8})
    p_value, table = detected(sampler.plain(processors), got)
    assert p_value < WINDOW_ALPHA, (
        f"the homogeneity test did not detect token trees judged without the residual (smallest p-value "
        f"{p_value:.3g}; totals {totals}): raise NUM_SAMPLES.\n{table}"
    )


SCHEDULE_CASES = [
    pytest.param({"temperature": 0.8}, "model", "level0", id="level0-model"),
    pytest.param({"top_k": 4}, "ngram", "level0", id="level0-ngram"),
    pytest.param({"temperature": 1.1, "top_p": 0.9}, "model", "adaptive", id="adaptive-model"),
]


@pytest.mark.parametrize("processors, drafter, schedule", SCHEDULE_CASES)
def test_sampled_triforce_with_other_schedules_matches_plain_generate(sampler, processors, drafter, schedule):
    """The same test for level 0 -> 2 rounds (level 2 judges the drafter directly, with its probabilities or a
    one-hot ``q``) and for the adaptive planner's own mix of schedules."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter, schedule=schedule)
    same_distribution(plain, got, f"TriForce sampling ({schedule=}, {drafter=}, {processors}; level totals {totals})")
    if schedule == "level0":
        assert totals["level1_drafted"] == 0, totals
        assert 0 < totals["level0_to_level2_accepted"] < totals["level0_to_level2_drafted"], totals
    else:  # the planner's own mix over many seeds: level 0 -> 1 -> 2 first, level 0 -> 2 only where the costs this
        # machine timed let it win (none, on a CPU where the draft model's steps cost too much; the level0 cases
        # judge those rounds)
        assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals


REUSE_CASES = [
    pytest.param({"temperature": 0.7}, "none", id="temperature0.7-none"),
    pytest.param({"top_p": 0.8}, "model", id="top_p0.8-model"),
]


@pytest.mark.parametrize("processors, drafter", REUSE_CASES)
def test_sampled_triforce_from_a_prefilled_cache_matches_plain_generate(sampler, processors, drafter):
    """The same test when each TriForce run starts from a copy of a cache holding 90 of the 100 prompt tokens."""
    plain = sampler.plain(processors)
    got, totals = sampler.triforce(processors, drafter, cached=PROMPT_LENGTH - 10)
    same_distribution(plain, got, f"TriForce sampling from a reused cache ({drafter=}, {processors}; totals {totals})")
    assert totals["reused_tokens"] == PROMPT_LENGTH - 10, totals
    check_paths(totals, drafter)


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


# ---------------------------------------------------------------------------------------------------
# Batches: every row of a batched call has its own prompt's distribution.

BATCH_COPIES = 50
"""``num_return_sequences`` of each batched call: 2 prompts x 50 copies = a batch of 100 rows."""


BATCH_SEEDS = range(NUM_SAMPLES // BATCH_COPIES)
"""Seeds of the batched calls, from 0: never chosen after a failure. (An earlier version moved them to 5000 after the
first case gave p = 0.00038 on these seeds; they are back at 0, and any failure is answered with more samples.)"""


BATCH_CASES = [
    ({"temperature": 0.9, "top_k": 5}, "ngram", {}),
    ({"top_p": 0.8}, "none", {}),
    ({"temperature": 1.2}, "model", {}),
    ({"temperature": 1.1}, "model", {"cuda_graphs": "eager"}),  # fixed-shape steps (what CUDA graphs replay)
]


def _batch_runs(target, batch, mask, config, kwargs: dict, seeds: range) -> tuple[torch.Tensor, dict[str, int]]:
    """Batched TriForce calls seeded with ``seeds``: their ``[len(seeds) * rows, T]`` sequences and summed
    statistics."""
    rows, totals = [], {"level1_drafted": 0, "level1_accepted": 0, "refreshes": 0}
    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            torch.manual_seed(seed)
            rows.append(
                target.generate(
                    batch,
                    attention_mask=mask,
                    max_new_tokens=NEW_TOKENS,
                    do_sample=True,
                    pad_token_id=0,
                    triforce_config=config,
                    **{"num_return_sequences": BATCH_COPIES, **kwargs},
                )
            )
            stats = hf_triforce.last_stats(target)
            totals["level1_drafted"] += stats.level1.drafted
            totals["level1_accepted"] += stats.level1.accepted
            totals["refreshes"] += stats.retrieval_refreshes
    return torch.cat(rows), totals


@pytest.mark.parametrize("processors, drafter, steps", BATCH_CASES)
def test_sampled_batch_rows_match_plain_generate(sampler, processors, drafter, steps):
    """A left-padded batch of two prompts (100 and 80 tokens), each repeated by ``num_return_sequences``: the rows
    of each prompt are distributed like plain sampling of that prompt alone, each prompt tested on its own."""
    short = torch.randint(0, VOCAB, (1, 80), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([sampler.prompt, torch.cat([short.new_zeros(1, 20), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    config = TriForceConfig(drafter=drafter, adaptive=False, **SPARSE, **steps)
    assistant = {"assistant_model": sampler.draft} if drafter == "model" else {}
    parts = _in_workers(_batch_runs, (sampler.target, batch, mask, config, {**processors, **assistant}), BATCH_SEEDS)
    sequences = torch.cat([part[0] for part in parts])
    totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
    first = sequences.view(-1, 2, BATCH_COPIES, sequences.shape[-1])[:, 0].reshape(-1, sequences.shape[-1])
    second = sequences.view(-1, 2, BATCH_COPIES, sequences.shape[-1])[:, 1].reshape(-1, sequences.shape[-1])
    plain_second = Sampler(sampler.target, None, short).plain(processors)
    cases = (("100-token prompt", sampler.plain(processors), first), ("80-token prompt", plain_second, second))
    for name, plain, got in cases:
        same_distribution(
            plain, sampler.codes(got), f"batched TriForce rows ({name}, {drafter=}, {processors}; {totals})"
        )
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
    assert totals["refreshes"] > 0, totals


def test_sampled_batch_from_cached_prefixes_matches_plain_generate(sampler):
    """The batch of :func:`test_sampled_batch_rows_match_plain_generate` (the 100-token prompt, and the 80-token one
    left-padded), its rows' first 60 tokens already in a per-row ``DynamicCache`` passed to each call: each prompt's
    rows are distributed like plain sampling of that prompt alone."""
    short = torch.randint(0, VOCAB, (1, 80), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([sampler.prompt, torch.cat([short.new_zeros(1, 20), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :20] = 0
    rows, masks = batch.repeat_interleave(BATCH_COPIES, 0), mask.repeat_interleave(BATCH_COPIES, 0)
    prefix = DynamicCache()
    with torch.no_grad():
        positions = (masks[:, :60].cumsum(-1) - 1).clamp(min=0)
        sampler.target(input_ids=rows[:, :60], attention_mask=masks[:, :60], position_ids=positions, use_cache=True,
                       **cache_kwargs(prefix))  # fmt: skip
    config = TriForceConfig(drafter="ngram", adaptive=False, **SPARSE)
    reuse = {"num_return_sequences": 1, CACHE_ARG: prefix}  # a batched call copies the cache: every call starts alike
    parts = _in_workers(_batch_runs, (sampler.target, rows, masks, config, reuse), BATCH_SEEDS)
    sequences = torch.cat([part[0] for part in parts]).view(-1, 2, BATCH_COPIES, batch.shape[1] + NEW_TOKENS)
    totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
    plain_short = Sampler(sampler.target, None, short).plain({})
    for name, plain, got in (("100-token prompt", sampler.plain({}), sequences[:, 0]), ("80-token", plain_short,
                                                                                        sequences[:, 1])):  # fmt: skip
        same_distribution(plain, sampler.codes(got.reshape(-1, got.shape[-1])), f"cached batch rows ({name}; {totals})")
    assert 0 < totals["level1_accepted"] < totals["level1_drafted"], totals
