"""Plain ``generate()`` against TriForce on the same model, prompt and device, in one process."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..config import TriForceConfig
from ..errors import InvalidInputError
from ..generation import enable
from ..hf.linears import swapped_linears
from ..hf.versions import cache_kwargs
from .divergence import Divergence, first_divergence
from .plain_baselines import best_plain, measure_plain_decodings
from .prefix import Prefix
from .timed_run import WARM_UP_TOKENS, RunResult, measure, peak_rss_bytes, warm_up

logger = logging.getLogger(__name__)


@dataclass
class Comparison:
    """Plain and TriForce runs of the same call; ``speedup`` is plain latency / TriForce latency per token.

    With several interleaved (plain, TriForce) pairs (``compare(..., repeats=N)``), ``pairs`` holds them all and
    ``plain``/``triforce`` are the pair of median speedup. ``dtype`` is the model's (``compare()`` records it):
    it bounds a near-tie (:func:`~hf_triforce.bench.divergence.first_divergence`).
    """

    plain: RunResult
    triforce: RunResult
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    plain_fast_linears: RunResult | None = None
    prompt_lookup: RunResult | None = None
    pairs: list[tuple[RunResult, RunResult]] = field(default_factory=list)
    dtype: torch.dtype | None = None
    plain_decodings: dict[str, RunResult | str] = field(default_factory=dict)
    assisted: RunResult | None = None

    @property
    def speedup(self) -> float:
        """Plain decode seconds per token (``generate()``'s defaults) over TriForce's (prefill excluded)."""
        return pair_speedup(self.plain, self.triforce)

    @property
    def best_plain(self) -> str:
        """The fastest plain decoding measured (``"dynamic"`` when no other was)."""
        return best_plain(self.plain_decodings) if self.plain_decodings else "dynamic"

    @property
    def best_plain_run(self) -> RunResult:
        """The run of :attr:`best_plain`."""
        return self.plain_decodings.get(self.best_plain, self.plain)

    @property
    def speedup_best_plain(self) -> float:
        """The fastest plain decoding's seconds per token over TriForce's: the headline ratio."""
        return pair_speedup(self.best_plain_run, self.triforce)

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
                raise InvalidInputError(
                    "a greedy difference is classified in the model's dtype: pass Comparison(dtype=...)"
                )
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
            "assisted_generation": None if self.assisted is None else self.assisted.to_dict(),
            "peak_rss_bytes": peak_rss_bytes(),
            "repeats": [_pair_dict(plain, fast) for plain, fast in self.pairs] if len(self.pairs) > 1 else None,
            "plain_decodings": {name: self._decoding_dict(run) for name, run in self.plain_decodings.items()},
            "best_plain": self.best_plain,
            "speedup_best_plain": self.speedup_best_plain,
        }

    def _decoding_dict(self, run: RunResult | str) -> dict[str, Any]:
        if isinstance(run, str):
            return {"error": run}
        same = (
            torch.equal(run.sequences, self.plain.sequences)
            if run.sequences.shape == self.plain.sequences.shape
            else False
        )
        return {**run.to_dict(), "identical_to_default": same}


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
    prefix: Prefix | None = None,
    plain_decodings: Sequence[str] = (),
    **generate_kwargs,
) -> Comparison:
    """Measure plain ``generate()`` then TriForce with the same kwargs and seed; prefill excluded.

    Args:
        model: the target model; :func:`hf_triforce.enable` is applied to it.
        input_ids: ``[1, prompt]`` token ids.
        triforce_config: the TriForce configuration.
        assistant_model: optional level-0 draft model; transformers' assisted generation with it is timed too
            (``Comparison.assisted``), as the peer a user with a draft model has.
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
        prefix: start every call from a copy of this prefilled prompt (:mod:`.prefix`: one prefill for all the
            calls; ``input_ids`` must be its prompt), with a warm-up from it too.
        plain_decodings: also time these plain configurations (:mod:`.plain_baselines`, from ``prefix`` when
            given; ``"dynamic"`` is the plain run itself): ``Comparison.plain_decodings`` and ``best_plain``.

    Example:
        >>> result = compare(model, ids, TriForceConfig(retrieval_budget=512), max_new_tokens=128)  # doctest: +SKIP
        >>> result.speedup, result.identical  # doctest: +SKIP
    """
    enable(model)
    extra = {"assistant_model": assistant_model} if assistant_model is not None else {}
    chunk = {"prefill_chunk_size": plain_prefill_chunk_size} if plain_prefill_chunk_size else {}

    def start() -> dict[str, Any]:  # each call's own copy of the prefilled prompt, if any
        return {} if prefix is None else cache_kwargs(prefix.copy())

    if warmup and prefix is not None:
        short = {**generate_kwargs, "max_new_tokens": WARM_UP_TOKENS, "min_new_tokens": WARM_UP_TOKENS}
        measure(model, input_ids, **start(), **short)
        measure(model, input_ids, triforce_config=triforce_config, **start(), **extra, **short)
    elif warmup:
        warm_up(model, input_ids, triforce_config, generate_kwargs, **extra)
    pairs = []
    greedy = not generate_kwargs.get("do_sample")  # its logits explain a difference (Comparison.divergence)
    for i in range(repeats):
        pair_seed = seed if greedy else seed + i  # sampled: each pair its own text
        logger.info("plain generate(): %d prompt tokens", input_ids.shape[1])
        plain = measure(model, input_ids, seed=pair_seed, keep_logits=greedy, **start(), **chunk, **generate_kwargs)
        logger.info("TriForce generate(): %d prompt tokens", input_ids.shape[1])
        fast = measure(model, input_ids, seed=pair_seed, keep_logits=greedy, triforce_config=triforce_config,
                       **start(), **extra, **generate_kwargs)  # fmt: skip
        pairs.append((plain, fast))
    plain, fast = median_pair(pairs)
    reference = None
    if reference_fast_linears:
        with swapped_linears([model]):
            reference = measure(model, input_ids, seed=seed, **start(), **chunk, **generate_kwargs)
    lookup = None
    if prompt_lookup_tokens:
        logger.info("prompt-lookup generate(): %d prompt tokens", input_ids.shape[1])
        lookup = measure(model, input_ids, seed=seed, prompt_lookup_num_tokens=prompt_lookup_tokens, **start(),
                         **chunk, **generate_kwargs)  # fmt: skip
    assisted = None
    if assistant_model is not None:  # transformers' own speculation with the same draft model, as a peer
        logger.info("assisted generate(): %d prompt tokens", input_ids.shape[1])
        assisted = measure(model, input_ids, seed=seed, assistant_model=assistant_model, **start(), **chunk,
                           **generate_kwargs)  # fmt: skip
    others = [name for name in plain_decodings if name != "dynamic"]
    decodings = {"dynamic": plain} if plain_decodings else {}
    if others:
        fresh = {} if prefix is not None else chunk  # a fresh call prefills the whole prompt: chunked as plain's
        decodings.update(measure_plain_decodings(model, input_ids, others, prefix, seed, **fresh, **generate_kwargs))
    return Comparison(plain, fast, generate_kwargs, reference, lookup, pairs, dtype=model.dtype,
                      plain_decodings=decodings, assisted=assisted)  # fmt: skip


def median_pair(pairs: list[tuple[RunResult, RunResult]]) -> tuple[RunResult, RunResult]:
    """The (plain, TriForce) pair of median speedup (the lower median for an even count)."""
    ranked = sorted(pairs, key=lambda pair: pair_speedup(*pair))
    return ranked[(len(ranked) - 1) // 2]
