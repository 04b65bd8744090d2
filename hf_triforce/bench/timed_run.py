"""One timed ``generate()`` call (prefill and decode timed apart), and the warm-up before timed calls."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..config import TriForceConfig
from ..generation import last_stats
from .timing_streamer import TimingStreamer

WARM_UP_TOKENS = 8


@dataclass
class RunResult:
    """One measured ``generate()`` call.

    Attributes:
        sequences: ``[1, prompt + new]`` token ids ``generate()`` returned.
        new_tokens: tokens generated.
        prefill_seconds: from the call to the first generated token.
        decode_seconds_per_token: mean seconds per generated token after the first.
        stats: ``hf_triforce.last_stats(model).to_dict()`` of a TriForce call, else None.
        peak_gpu_bytes: peak ``torch.cuda.max_memory_allocated`` during the call (CUDA only).
        logits: with ``measure(..., keep_logits=True)``, ``generate()``'s per-step logits (each ``[1, vocab]``),
            to explain where two greedy outputs differ (:mod:`hf_triforce.bench.divergence`).
    """

    sequences: torch.LongTensor
    new_tokens: int
    prefill_seconds: float
    decode_seconds_per_token: float
    stats: dict[str, Any] | None = None
    peak_gpu_bytes: int | None = None
    logits: tuple[torch.Tensor, ...] | None = None

    @property
    def tokens_per_second(self) -> float:
        """Decode throughput, prefill excluded."""
        return 1.0 / self.decode_seconds_per_token

    @property
    def end_to_end_seconds(self) -> float:
        """The whole call: prefill (first token) plus the decoding of the others."""
        return self.prefill_seconds + self.decode_seconds_per_token * max(self.new_tokens - 1, 0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready figures (the TriForce stats under ``"triforce"``), without the token ids."""
        names = ("new_tokens", "prefill_seconds", "decode_seconds_per_token", "peak_gpu_bytes")
        out = {k: getattr(self, k) for k in names}
        out["tokens_per_second"] = self.tokens_per_second
        out["end_to_end_seconds"] = self.end_to_end_seconds
        if self.stats is not None:
            out["triforce"] = self.stats
        return out


def measure(
    model, input_ids: torch.LongTensor, streamer=None, seed: int = 0, keep_logits: bool = False, **generate_kwargs
) -> RunResult:
    """Run ``model.generate(input_ids, **generate_kwargs)`` once, timing prefill and decode separately.

    On a CUDA device the peak of ``torch.cuda.max_memory_allocated`` during the call is recorded too.

    Args:
        model: a model (``hf_triforce.enable``-d when ``triforce_config`` is among the kwargs).
        input_ids: ``[1, prompt]`` token ids.
        streamer: optional streamer that also receives the tokens (e.g. a ``TextStreamer``).
        seed: ``torch.manual_seed`` set before the call (sampling reproducibility).
        keep_logits: also keep the per-step logits (``output_logits=True``; one ``[1, vocab]`` row per token).

    Example:
        >>> measure(model, ids, max_new_tokens=64, triforce_config=TriForceConfig()).tokens_per_second  # doctest: +SKIP
    """
    timer = TimingStreamer(inner=streamer)
    torch.manual_seed(seed)
    on_gpu = input_ids.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(input_ids.device)
    logits_kwargs = {"return_dict_in_generate": True, "output_logits": True} if keep_logits else {}
    with torch.inference_mode():
        output = model.generate(input_ids, streamer=timer, **logits_kwargs, **generate_kwargs)
    sequences, logits = (output.sequences, output.logits) if keep_logits else (output, None)
    peak = torch.cuda.max_memory_allocated(input_ids.device) if on_gpu else None
    stats = None
    if generate_kwargs.get("triforce_config") is not None:
        stats = last_stats(model).to_dict()
    new_tokens = sequences.shape[1] - input_ids.shape[1]
    return RunResult(sequences, new_tokens, timer.prefill_seconds, timer.decode_seconds_per_token, stats, peak, logits)


def warm_up(
    model,
    input_ids: torch.LongTensor,
    triforce_config: TriForceConfig,
    generate_kwargs: dict[str, Any],
    prompt_tokens: int | None = None,
    **extra,
) -> None:
    """Generate a few tokens plain, then with TriForce, on a prefix of ``input_ids`` before timed runs.

    By default the prefix is the whole prompt on the CPU (the first plain run at a new cache size was
    measured up to 10x slower per token there: the allocator, which a short warm-up prompt did not cover)
    and ``4/3`` of the retrieval budget elsewhere.

    Args:
        model: the target model (``hf_triforce.enable``-d).
        input_ids: ``[1, prompt]`` token ids.
        triforce_config: the TriForce configuration of the timed runs.
        generate_kwargs: the timed runs' ``generate()`` arguments (``min_new_tokens`` is dropped).
        prompt_tokens: the prefix length, instead of the default.
        extra: more ``generate()`` arguments of the TriForce run (e.g. ``assistant_model``).

    Example:
        >>> warm_up(model, ids, TriForceConfig(), {"max_new_tokens": 128, "do_sample": False})  # doctest: +SKIP
    """
    if prompt_tokens is None:
        prompt_tokens = input_ids.shape[1]
        if input_ids.device.type != "cpu":
            budget = triforce_config.for_context(prompt_tokens).retrieval_budget
            prompt_tokens = min(prompt_tokens, 4 * budget // 3)
    short = input_ids[:, :prompt_tokens]
    kwargs = {k: v for k, v in generate_kwargs.items() if k != "min_new_tokens"}
    kwargs["max_new_tokens"] = WARM_UP_TOKENS
    measure(model, short, **kwargs)
    measure(model, short, triforce_config=triforce_config, **extra, **kwargs)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (Linux/macOS).

    Example:
        >>> peak_rss_bytes() > 0
        True
    """
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage if sys.platform == "darwin" else usage * 1024  # macOS reports bytes, Linux kilobytes
