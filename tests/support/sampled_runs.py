"""The sampling tests' shared machinery: a tiny 8-token model, its draft model and prompt, seeded TriForce and plain
samples, and the homogeneity check of two samples window by window.

The method (why these sizes, seeds and significance level) is the docstring of
``tests/integration/test_sampling_distribution.py``; ``test_sampling_paths.py`` applies the same test to the other
paths a sampled call can take, and the same-seed tests of ``test_offload.py`` and ``test_cache_reuse.py`` compare
TriForce runs with each other.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import numpy as np
import torch
from transformers import DynamicCache

import hf_triforce
from hf_triforce import TriForceConfig
from hf_triforce.hf.versions import CACHE_ARG, cache_kwargs
from hf_triforce.hierarchy.planner import Plan, Planner
from tests.support.homogeneity import describe, homogeneity_test, window_codes

ALPHA = 1e-3
"""Significance level of every two-sample test (``test_sampling_distribution.py``'s docstring says why)."""
NUM_SAMPLES = 1000
"""Draws per sample (TriForce and plain, each)."""
WORKERS = 1 if "PYTEST_XDIST_WORKER" in os.environ else min(2, os.cpu_count() or 1)
"""Processes that draw a sample's TriForce runs. Each run is seeded on its own (``torch.manual_seed(i)``), so the
runs split over forked workers, one thread each, give the very sample one process gives: run alone, a sampling
module takes half the time on 2 cores. 1 in a pytest-xdist worker (``make test``), whose workers already share the
cores."""

VOCAB = 8
PROMPT_LENGTH = 100
NEW_TOKENS = 6
"""The prefill's token and one whole round: ``gamma2`` level-1 drafts and level 2's bonus token."""
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
        seeds: range = TRIFORCE_SEEDS,
    ) -> tuple[np.ndarray, dict[str, int]]:
        """TriForce continuations, run ``i`` seeded with ``i`` for ``i`` in ``seeds`` (``NUM_SAMPLES`` of them by
        default), and the summed statistics.

        ``cached > 0``: every run is given a deep copy of a ``DynamicCache`` holding the first ``cached`` prompt
        tokens (prefilled once by a plain forward), the documented pattern for several questions on one prefix.
        ``schedule``: ``"fixed"`` (``adaptive=False``: level 0 -> 1 -> 2 every round, so both levels' rejection
        rules run), ``"adaptive"`` (the planner's choice, timing-dependent), or ``"level0"`` (the planner forced
        to level 0 -> 2 rounds: level 2 judges the drafter's tokens against its probabilities directly).
        ``options``: more ``TriForceConfig`` fields.
        """
        key = (
            tuple(sorted(processors.items())),
            drafter,
            cached,
            schedule,
            tuple(sorted((options or {}).items())),
            seeds,
        )
        if memoize and key in self._triforce:
            return self._triforce[key]
        config = TriForceConfig(drafter=drafter, adaptive=schedule != "fixed", **SPARSE, **(options or {}))
        forced = Plan("level0", config.gamma1 + config.gamma2) if schedule == "level0" else None
        force = mock.patch.object(Planner, "plan_round", lambda planner, room=None: forced)
        with force if forced else contextlib.nullcontext():
            result = self._triforce_runs(config, processors, drafter, cached, seeds)
        if memoize:
            self._triforce[key] = result
        return result

    def _triforce_runs(self, config, processors: dict, drafter: str, cached: int, seeds: range):
        """The runs of ``seeds`` (split over :data:`WORKERS` processes): their codes and summed totals."""
        parts = in_workers(self._runs, (config, processors, drafter, cached), seeds)
        totals = {name: sum(part[1][name] for part in parts) for name in parts[0][1]}
        totals["reused_tokens"] = parts[0][1]["reused_tokens"]  # the same in every run
        return np.concatenate([part[0] for part in parts]), totals

    def _runs(self, config, processors: dict, drafter: str, cached: int, seeds: range):
        """TriForce runs seeded with ``seeds`` (one call each): their codes and summed statistics."""
        assistant = self.draft if drafter in ("model", "auto") else None
        levels = ("level0", "level1", "level0_to_level2")
        totals = {f"{level}_{count}": 0 for level in levels for count in ("drafted", "accepted", "rejections")}
        totals["retrieval_refreshes"] = totals["reused_tokens"] = totals["levels_rounds"] = totals["tree_rounds"] = 0
        totals["kv_bytes_to_device"] = 0
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
                totals["kv_bytes_to_device"] += stats["kv_bytes_to_device"]
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
"""What the forked workers of :func:`in_workers` run: ``(function, arguments)``, set before they fork."""


def in_workers(function, arguments: tuple, seeds: range) -> list:
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
    """In a worker: the job of :func:`in_workers` for ``seeds``, on one thread."""
    torch.set_num_threads(1)
    function, arguments = _JOB
    return function(*arguments, seeds)


def tiny_sampler(model_factory) -> Sampler:
    """The tiny target (TriForce-enabled), a 1-layer draft model of the same vocabulary and the prompt
    (``model_factory``: the integration tier's fixture)."""
    with torch.random.fork_rng(devices=[]):
        target = model_factory("llama_gqa", num_layers=2, seed=0, vocab_size=VOCAB)
        draft = model_factory("llama_gqa", num_layers=1, seed=100, vocab_size=VOCAB, enable=False)
    prompt = torch.randint(0, VOCAB, (1, PROMPT_LENGTH), generator=torch.Generator().manual_seed(1))
    return Sampler(target, draft, prompt)


@contextlib.contextmanager
def one_thread():
    """One intra-op thread within the block, the previous count restored after it.

    The models are tiny, so thread synchronization dominates every forward: on a shared 2-core machine
    two threads made a TriForce call 10-20x slower than one.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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


def same_tokens(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Fail unless two ``[N, NEW_TOKENS]`` samples drawn with the same seeds are equal row for row, naming the first
    rows that differ (``what``: the option that made ``got`` differ from ``expected``'s call)."""
    differ = np.flatnonzero((got != expected).any(axis=1))
    assert differ.size == 0, (
        f"with {what}, {differ.size} of {len(got)} seeded calls drew other tokens than the same call without it: "
        f"seeds {differ[:5].tolist()}, e.g. {got[differ[0]].tolist()} instead of {expected[differ[0]].tolist()}"
    )


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
