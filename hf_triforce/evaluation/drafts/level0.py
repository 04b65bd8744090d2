"""Level-0 drafters measured against level 1 along a reference: n-gram lookup, a truncated-layer model.

No small model sharing the target's tokenizer is available offline, so the tiny-model drafter evaluated
here is training-free: the target's first ``k`` decoder layers, its final norm and its LM head
(:func:`hf_triforce.hf.model.truncated_model`, sharing the target's weights; an "early exit" draft). It runs with the
package's :class:`~hf_triforce.hierarchy.ModelDrafter` and :class:`~hf_triforce.caches.StreamingLLMCache`,
as TriForce runs any draft model.

At each position ``j`` the drafter proposes one token after the reference prefix; its acceptance is
measured against level 1's distribution ``p_hat_j`` (the verifier of level 0) with
:mod:`~hf_triforce.evaluation.drafts.acceptance`: argmax agreement at ``T = 0``, ``p_hat(x)`` for an n-gram draft
``x`` and ``sum_x min(q, p_hat)`` for a sampled model draft at ``T > 0``.

Example:
    >>> draft = truncated_model(model, num_layers=4)  # doctest: +SKIP
    >>> measure_drafter(NGramDrafter(3, 1), ref, level1_logits).acceptance  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...caches.streaming import StreamingLLMCache
from ...config import TriForceConfig
from ...hf.linears import small_batch_linears
from ...hf.model import layer_rotary, num_layers
from ...hierarchy import ModelDrafter, NGramDrafter
from .acceptance import logits_processors, processed_probs, token_acceptance
from .reference import Reference


@dataclass
class DrafterMeasurement:
    """Level-0 proposals along a reference.

    Attributes:
        coverage: fraction of positions where the drafter proposed a token.
        acceptance: mean acceptance of the proposed tokens (nan when none).
        proposals: positions with a proposal.
        positions: positions measured.
    """

    coverage: float
    acceptance: float
    proposals: int
    positions: int


def model_drafter(draft, config: TriForceConfig, temperature: float, top_p: float = 1.0) -> ModelDrafter:
    """A :class:`ModelDrafter` over a fresh :class:`StreamingLLMCache`, set up as TriForce decoding sets it up."""
    budget, sinks = config.draft_cache_budget, config.draft_sinks
    freqs, interleaved = layer_rotary(draft)
    cache = StreamingLLMCache(num_layers(draft), budget, sinks, freqs, config.draft_evict_batch, interleaved)
    return ModelDrafter(draft, cache, logits_processors(temperature, top_p), do_sample=temperature > 0)


def measure_drafter(
    drafter: NGramDrafter | ModelDrafter | None,
    ref: Reference,
    level1_logits: torch.Tensor,
    top_p: float = 1.0,
    seed: int = 0,
) -> DrafterMeasurement:
    """One-token level-0 proposals at positions ``1 .. m - 1`` of ``ref``, against level 1's logits.

    Args:
        drafter: an :class:`NGramDrafter`, a :class:`ModelDrafter`, or None (no level 0).
        ref: the reference continuation (the prefixes the drafter sees).
        level1_logits: ``[m - 1, V]`` level-1 logits at those positions (the verifier of level 0).
        top_p: nucleus threshold when sampling.
        seed: seed for a sampling model drafter's draws (they do not change its acceptance, only ``x``).

    Returns:
        a :class:`DrafterMeasurement`.
    """
    positions = ref.tokens.shape[0] - 1
    if drafter is None or positions <= 0:
        return DrafterMeasurement(0.0, float("nan"), 0, max(positions, 0))
    sequence, n = ref.sequence(), ref.prompt_length
    torch.manual_seed(seed)
    rates = []
    with torch.inference_mode(), small_batch_linears(getattr(drafter, "model", None)):
        for j in range(1, positions + 1):
            tokens, probs = drafter.propose(sequence[: n + j], 1)
            if tokens.numel():
                rates.append(_rate(tokens[:1], probs, level1_logits[j - 1 : j], ref.temperature, top_p))
    accepted = torch.cat(rates) if rates else torch.empty(0)
    mean = float(accepted.mean()) if rates else float("nan")
    return DrafterMeasurement(len(rates) / positions, mean, len(rates), positions)


def _rate(token, probs, p_hat_logits, temperature: float, top_p: float) -> torch.Tensor:
    if probs is None or temperature <= 0:
        return token_acceptance(p_hat_logits, token, temperature, top_p)
    p_hat = processed_probs(p_hat_logits, temperature, top_p)
    return torch.minimum(probs[:1].float(), p_hat).sum(dim=-1)
