"""Plain ``generate()`` against TriForce on the same model, prompt and device, in one process."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import TriForceConfig
from ...generation import enable
from ...hf.linears import small_batch_linears
from ..common.divergence import Divergence, first_divergence
from .timed_run import RunResult, measure, peak_rss_bytes, warm_up

logger = logging.getLogger(__name__)


@dataclass
class Comparison:
    """Plain and TriForce runs of the same call; ``speedup`` is plain latency / TriForce latency per token.

    With several interleaved (plain, TriForce) pairs (``compare(..., repeats=N)``), ``pairs`` holds them all and
    ``plain``/``triforce`` are the pair of median speedup. ``dtype`` is the model's (``compare()`` records it):
    it bounds a near-tie (:func:`~hf_triforce.evaluation.common.divergence.first_divergence`).
    """

    plain: RunResult
    triforce: RunResult
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    plain_fast_linears: RunResult | None = None
    prompt_lookup: RunResult | None = None
    pairs: list[tuple[RunResult, RunResult]] = field(default_factory=list)
    dtype: torch.dtype | None = None

    @property
    def speedup(self) -> float:
        """Plain decode seconds per token over TriForce's (prefill excluded)."""
        return pair_speedup(self.plain, self.triforce)

    @property
    def identical(self) -> bool:
        """Whether plain and TriForce produced the same token ids (in every pair)."""
        pairs = self.pairs or [(self.plain, self.triforce)]
        return all(torch.equal(plain.sequences, fast.sequences) for plain, fast in pairs)

    @property
    def divergence(self) -> Divergence | None:
        """Where the first differing pair's greedy outputs first differ (near-tie or not); None when identical
        or sampled."""
        if self.generate_kwargs.get("do_sample"):
            return None
        for plain, fast in self.pairs or [(self.plain, self.triforce)]:
            if torch.equal(plain.sequences, fast.sequences):
                continue
            if self.dtype is None:
                raise ValueError("a greedy difference is classified in the model's dtype: pass Comparison(dtype=...)")
            prompt = plain.sequences.shape[1] - plain.new_tokens
            found = first_divergence(
                prompt, plain.sequences, fast.sequences, plain.logits, fast.logits, dtype=self.dtype
            )
            if found is not None:
                return found
        return None

    def to_dict(self) -> dict[str, Any]:
        """The comparison as a JSON-ready row (the benchmark's result format)."""
        kwargs = {k: v for k, v in self.generate_kwargs.items() if isinstance(v, int | float | bool | str)}
        divergence = self.divergence
        return {
            "generate_kwargs": kwargs,
            "plain": self.plain.to_dict(),
            "triforce": self.triforce.to_dict(),
            "speedup": self.speedup,
            "identical_output": self.identical,
            "divergence": None if divergence is None else divergence.to_dict(),
            "plain_fast_linears": None if self.plain_fast_linears is None else self.plain_fast_linears.to_dict(),
            "prompt_lookup": None if self.prompt_lookup is None else self.prompt_lookup.to_dict(),
            "peak_rss_bytes": peak_rss_bytes(),
            "repeats": [_pair_dict(plain, fast) for plain, fast in self.pairs] if len(self.pairs) > 1 else None,
        }


def pair_speedup(plain: RunResult, fast: RunResult) -> float:
    """Plain decode seconds per token over TriForce's (prefill excluded)."""
    return plain.decode_seconds_per_token / fast.decode_seconds_per_token


def _pair_dict(plain: RunResult, fast: RunResult) -> dict[str, float]:
    return {
        "plain_tokens_per_second": plain.tokens_per_second,
        "triforce_tokens_per_second": fast.tokens_per_second,
        "speedup": pair_speedup(plain, fast),
    }


def compare(
    model,
    input_ids: torch.LongTensor,
    triforce_config: TriForceConfig,
    assistant_model=None,
    warmup: bool = True,
    seed: int = 0,
    reference_fast_linears: bool = False,
    plain_prefill_chunk_size: int | None = None,
    prompt_lookup_tokens: int | None = None,
    repeats: int = 1,
    **generate_kwargs,
) -> Comparison:
    """Measure plain ``generate()`` then TriForce with the same kwargs and seed; prefill excluded.

    Args:
        model: the target model; :func:`hf_triforce.enable` is applied to it.
        input_ids: ``[1, prompt]`` token ids.
        triforce_config: the TriForce configuration.
        assistant_model: optional level-0 draft model.
        warmup: run both once on a short prefix first (one-time allocations, kernel selection).
        seed: sampling seed, the same for both runs.
        reference_fast_linears: also measure plain ``generate()`` with TriForce's CPU linear fast path
            (:mod:`hf_triforce.kernels.linear`), to show how much of the speedup that path alone gives.
        plain_prefill_chunk_size: transformers' ``prefill_chunk_size`` for the plain runs (memory only: the
            prefill is not timed), to match ``triforce_config.prefill_chunk_size`` at long context.
        prompt_lookup_tokens: also measure transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``)
            on the same prompt, as a third row.
        repeats: measure this many (plain, TriForce) pairs, interleaved, and report the pair of median speedup
            (a shared machine's speed drifts by 10-30% within minutes; interleaving exposes both to the same drift).
            Sampled pairs use seeds ``seed, seed + 1, ...``: a sampled text's speedup depends on the text (a
            passage level 1 is sure of runs in long rounds), so the median is taken over several texts.

    Example:
        >>> result = compare(model, ids, TriForceConfig(retrieval_budget=512), max_new_tokens=128)  # doctest: +SKIP
        >>> result.speedup, result.identical  # doctest: +SKIP
    """
    enable(model)
    extra = {"assistant_model": assistant_model} if assistant_model is not None else {}
    chunk = {"prefill_chunk_size": plain_prefill_chunk_size} if plain_prefill_chunk_size else {}
    if warmup:
        warm_up(model, input_ids, triforce_config, generate_kwargs, **extra)
    pairs = []
    greedy = not generate_kwargs.get("do_sample")  # its logits explain a difference (Comparison.divergence)
    for i in range(repeats):
        pair_seed = seed if greedy else seed + i  # sampled: each pair its own text
        logger.info("plain generate(): %d prompt tokens", input_ids.shape[1])
        plain = measure(model, input_ids, seed=pair_seed, keep_logits=greedy, **chunk, **generate_kwargs)
        logger.info("TriForce generate(): %d prompt tokens", input_ids.shape[1])
        fast = measure(model, input_ids, seed=pair_seed, keep_logits=greedy, triforce_config=triforce_config, **extra,
                       **generate_kwargs)  # fmt: skip
        pairs.append((plain, fast))
    plain, fast = median_pair(pairs)
    reference = None
    if reference_fast_linears:
        with small_batch_linears(model):
            reference = measure(model, input_ids, seed=seed, **chunk, **generate_kwargs)
    lookup = None
    if prompt_lookup_tokens:
        logger.info("prompt-lookup generate(): %d prompt tokens", input_ids.shape[1])
        lookup = measure(model, input_ids, seed=seed, prompt_lookup_num_tokens=prompt_lookup_tokens, **chunk,
                         **generate_kwargs)  # fmt: skip
    return Comparison(plain, fast, generate_kwargs, reference, lookup, pairs, dtype=model.dtype)


def median_pair(pairs: list[tuple[RunResult, RunResult]]) -> tuple[RunResult, RunResult]:
    """The (plain, TriForce) pair of median speedup (the lower median for an even count)."""
    ranked = sorted(pairs, key=lambda pair: pair_speedup(*pair))
    return ranked[(len(ranked) - 1) // 2]
