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
from ..hf.versions import cache_kwargs
from .divergence import Divergence, first_divergence
from .plain_baselines import best_plain, measure_plain_decodings
from .prefix import Prefix
from .timed_run import WARM_UP_TOKENS, RunResult, measure, peak_rss_bytes, warm_up

logger = logging.getLogger(__name__)


@dataclass
class Comparison:
    """Plain and TriForce runs of the same call; ``speedup`` is plain latency / TriForce latency per token.

    ``dtype`` is the model's (``compare()`` records it): it bounds a near-tie
    (:func:`~hf_triforce.bench.divergence.first_divergence`).
    """

    plain: RunResult
    triforce: RunResult
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_lookup: RunResult | None = None
    dtype: torch.dtype | None = None
    plain_decodings: dict[str, RunResult | str] = field(default_factory=dict)

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
        """Whether plain and TriForce produced the same token ids."""
        return torch.equal(self.plain.sequences, self.triforce.sequences)

    @property
    def divergence(self) -> Divergence | None:
        """Where the greedy outputs first differ (near-tie or not); None when identical or sampled."""
        if self.generate_kwargs.get("do_sample") or self.identical:
            return None
        if self.dtype is None:
            raise InvalidInputError(
                "a greedy difference is classified in the model's dtype: pass Comparison(dtype=...)"
            )
        plain, fast = self.plain, self.triforce
        prompt = plain.sequences.shape[1] - plain.new_tokens
        return first_divergence(prompt, plain.sequences, fast.sequences, plain.logits, fast.logits, dtype=self.dtype)

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
            "prompt_lookup": None if self.prompt_lookup is None else self.prompt_lookup.to_dict(),
            "peak_rss_bytes": peak_rss_bytes(),
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


def compare(
    model,
    input_ids: torch.LongTensor,
    triforce_config: TriForceConfig,
    assistant_model=None,
    warmup: bool = True,
    seed: int = 0,
    plain_prefill_chunk_size: int | None = None,
    prompt_lookup_tokens: int | None = None,
    prefix: Prefix | None = None,
    plain_decodings: Sequence[str] = (),
    **generate_kwargs,
) -> Comparison:
    """Measure plain ``generate()`` then TriForce with the same kwargs and seed; prefill excluded.

    Args:
        model: the target model; :func:`hf_triforce.enable` is applied to it.
        input_ids: ``[1, prompt]`` token ids.
        triforce_config: the TriForce configuration.
        assistant_model: optional level-0 draft model (TriForce's).
        warmup: run both once on a short prefix first (one-time allocations, kernel selection).
        seed: sampling seed, the same for both runs.
        plain_prefill_chunk_size: transformers' ``prefill_chunk_size`` for the plain runs (memory only: the
            prefill is not timed), to match ``triforce_config.prefill_chunk_size`` at long context.
        prompt_lookup_tokens: also measure transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``)
            on the same prompt, as a third row.
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
    greedy = not generate_kwargs.get("do_sample")  # its logits explain a difference (Comparison.divergence)
    logger.info("plain generate(): %d prompt tokens", input_ids.shape[1])
    plain = measure(model, input_ids, seed=seed, keep_logits=greedy, **start(), **chunk, **generate_kwargs)
    logger.info("TriForce generate(): %d prompt tokens", input_ids.shape[1])
    fast = measure(model, input_ids, seed=seed, keep_logits=greedy, triforce_config=triforce_config, **start(),
                   **extra, **generate_kwargs)  # fmt: skip
    lookup = None
    if prompt_lookup_tokens:
        logger.info("prompt-lookup generate(): %d prompt tokens", input_ids.shape[1])
        lookup = measure(model, input_ids, seed=seed, prompt_lookup_num_tokens=prompt_lookup_tokens, **start(),
                         **chunk, **generate_kwargs)  # fmt: skip
    others = [name for name in plain_decodings if name != "dynamic"]
    decodings = {"dynamic": plain} if plain_decodings else {}
    if others:
        fresh = {} if prefix is not None else chunk  # a fresh call prefills the whole prompt: chunked as plain's
        decodings.update(measure_plain_decodings(model, input_ids, others, prefix, seed, **fresh, **generate_kwargs))
    return Comparison(plain, fast, generate_kwargs, lookup, dtype=model.dtype, plain_decodings=decodings)
