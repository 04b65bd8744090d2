"""Plain ``generate()`` against TriForce on the same model, prompt and device, in one process."""

from __future__ import annotations

import logging
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import TriForceConfig
from ...hf.linears import small_batch_linears
from .timing import TimingStreamer

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """One measured ``generate()`` call."""

    sequences: torch.LongTensor
    new_tokens: int
    prefill_seconds: float
    decode_seconds_per_token: float
    stats: dict[str, Any] | None = None
    peak_gpu_bytes: int | None = None

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput, prefill excluded."""
        return 1.0 / self.decode_seconds_per_token

    def to_dict(self) -> dict[str, Any]:
        names = ("new_tokens", "prefill_seconds", "decode_seconds_per_token", "peak_gpu_bytes")
        out = {k: getattr(self, k) for k in names}
        out["tokens_per_second"] = self.tokens_per_second
        if self.stats is not None:
            out["triforce"] = self.stats
        return out


@dataclass
class Comparison:
    """Plain and TriForce runs of the same call; ``speedup`` is plain latency / TriForce latency per token."""

    plain: RunResult
    triforce: RunResult
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    plain_fast_linears: RunResult | None = None

    @property
    def speedup(self) -> float:
        return self.plain.decode_seconds_per_token / self.triforce.decode_seconds_per_token

    @property
    def identical(self) -> bool:
        return torch.equal(self.plain.sequences, self.triforce.sequences)

    def to_dict(self) -> dict[str, Any]:
        kwargs = {k: v for k, v in self.generate_kwargs.items() if isinstance(v, int | float | bool | str)}
        return {
            "generate_kwargs": kwargs,
            "plain": self.plain.to_dict(),
            "triforce": self.triforce.to_dict(),
            "speedup": self.speedup,
            "identical_output": self.identical,
            "plain_fast_linears": None if self.plain_fast_linears is None else self.plain_fast_linears.to_dict(),
            "peak_rss_bytes": peak_rss_bytes(),
        }


def measure(model, input_ids: torch.LongTensor, streamer=None, seed: int = 0, **generate_kwargs) -> RunResult:
    """Run ``model.generate(input_ids, **generate_kwargs)`` once, timing prefill and decode separately.

    On a CUDA device the peak of ``torch.cuda.max_memory_allocated`` during the call is recorded too.

    Args:
        model: a model (``hf_triforce.enable``-d when ``triforce_config`` is among the kwargs).
        input_ids: ``[1, prompt]`` token ids.
        streamer: optional streamer that also receives the tokens (e.g. a ``TextStreamer``).
        seed: ``torch.manual_seed`` set before the call (sampling reproducibility).

    Example:
        >>> measure(model, ids, max_new_tokens=64, triforce_config=TriForceConfig()).tokens_per_second  # doctest: +SKIP
    """
    import hf_triforce

    timer = TimingStreamer(inner=streamer)
    torch.manual_seed(seed)
    on_gpu = input_ids.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(input_ids.device)
    with torch.inference_mode():
        sequences = model.generate(input_ids, streamer=timer, **generate_kwargs)
    peak = torch.cuda.max_memory_allocated(input_ids.device) if on_gpu else None
    stats = None
    if generate_kwargs.get("triforce_config") is not None:
        stats = hf_triforce.last_stats(model).to_dict()
    new_tokens = sequences.shape[1] - input_ids.shape[1]
    return RunResult(sequences, new_tokens, timer.prefill_seconds, timer.decode_seconds_per_token, stats, peak)


def compare(
    model,
    input_ids: torch.LongTensor,
    triforce_config: TriForceConfig,
    assistant_model=None,
    warmup: bool = True,
    seed: int = 0,
    reference_fast_linears: bool = False,
    plain_prefill_chunk_size: int | None = None,
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

    Example:
        >>> result = compare(model, ids, TriForceConfig(retrieval_budget=512), max_new_tokens=128)  # doctest: +SKIP
        >>> result.speedup, result.identical  # doctest: +SKIP
    """
    import hf_triforce

    hf_triforce.enable(model)
    extra = {"assistant_model": assistant_model} if assistant_model is not None else {}
    chunk = {"prefill_chunk_size": plain_prefill_chunk_size} if plain_prefill_chunk_size else {}
    if warmup:
        _warm_up(model, input_ids, triforce_config, extra, generate_kwargs)
    logger.info("plain generate(): %d prompt tokens", input_ids.shape[1])
    plain = measure(model, input_ids, seed=seed, **chunk, **generate_kwargs)
    logger.info("TriForce generate(): %d prompt tokens", input_ids.shape[1])
    fast = measure(model, input_ids, seed=seed, triforce_config=triforce_config, **extra, **generate_kwargs)
    reference = None
    if reference_fast_linears:
        with small_batch_linears(model):
            reference = measure(model, input_ids, seed=seed, **chunk, **generate_kwargs)
    return Comparison(plain, fast, generate_kwargs, reference)


def _warm_up(model, input_ids, triforce_config, extra, generate_kwargs) -> None:
    """A few tokens of each method. On the CPU over the whole prompt: the first plain run at a new cache size
    was measured up to 10x slower per token (the allocator), which a short warm-up prompt did not cover."""
    length = input_ids.shape[1]
    if input_ids.device.type != "cpu":
        length = min(length, 4 * triforce_config.retrieval_budget // 3)
    short = input_ids[:, :length]
    kwargs = {k: v for k, v in generate_kwargs.items() if k != "min_new_tokens"}
    kwargs["max_new_tokens"] = 8
    measure(model, short, **kwargs)
    measure(model, short, triforce_config=triforce_config, **extra, **kwargs)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux/macOS)."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage if sys.platform == "darwin" else usage * 1024  # macOS reports bytes, Linux kilobytes
