"""Level-0 drafters measured against level 1 along a reference: n-gram lookup, a truncated-layer model.

No small model sharing the target's tokenizer is available offline, so the tiny-model drafter evaluated
here is training-free: the target's first ``k`` decoder layers, its final norm and its LM head
(:func:`truncated_model`, sharing the target's weights; an "early exit" draft). It runs with the
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

import copy
from dataclasses import dataclass

import torch

from ...caches.streaming import StreamingLLMCache
from ...config import TriForceConfig
from ...errors import UnsupportedModelError
from ...hf.linears import small_batch_linears
from ...hf.model import rotary_inv_freq
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

    @property
    def accepted_per_position(self) -> float:
        """Expected accepted level-0 tokens per position (``coverage * acceptance``)."""
        return 0.0 if not self.proposals else self.coverage * self.acceptance


def truncated_model(model, num_layers: int):
    """A draft model made of ``model``'s first ``num_layers`` layers, final norm and LM head (shared weights).

    Args:
        model: a Llama-style causal LM (``model.model.layers``, ``.norm``, ``.embed_tokens``, ``.rotary_emb``).
        num_layers: decoder layers kept (``1 <= num_layers <=`` the model's).

    Raises:
        UnsupportedModelError: the model does not have that layout, or ``num_layers`` is out of range.

    Example:
        >>> draft = truncated_model(model, 4)  # doctest: +SKIP
        >>> draft.config.num_hidden_layers  # doctest: +SKIP
        4
    """
    inner = getattr(model, "model", None)
    parts = ("layers", "norm", "embed_tokens", "rotary_emb")
    if inner is None or not all(hasattr(inner, p) for p in parts) or not hasattr(model, "lm_head"):
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a Llama-style causal LM (model.layers, norm, embed_tokens, rotary_emb, "
            "lm_head): a truncated-layer draft cannot be built from it; pass --draft-layers 0 to skip it."
        )
    total = len(inner.layers)
    if not 1 <= num_layers <= total:
        raise UnsupportedModelError(f"draft layers must be in [1, {total}], got {num_layers}.")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):
        draft = type(model)(config)
    draft.model.embed_tokens, draft.model.norm, draft.model.rotary_emb = (
        inner.embed_tokens,
        inner.norm,
        inner.rotary_emb,
    )
    draft.model.layers = torch.nn.ModuleList(inner.layers[:num_layers])
    draft.lm_head = model.lm_head
    left = [name for name, t in (*draft.named_parameters(), *draft.named_buffers()) if t.is_meta]
    if left:
        raise UnsupportedModelError(f"truncated draft of {type(model).__name__} has unshared tensors {left[:3]}.")
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()


def model_drafter(draft, config: TriForceConfig, temperature: float, top_p: float = 1.0) -> ModelDrafter:
    """A :class:`ModelDrafter` over a fresh :class:`StreamingLLMCache`, set up as TriForce decoding sets it up."""
    layers = draft.config.get_text_config().num_hidden_layers
    evict = min(16, (config.draft_cache_budget - config.draft_sinks - config.gamma1 - 1) // 2)
    cache = StreamingLLMCache(layers, config.draft_cache_budget, config.draft_sinks, rotary_inv_freq(draft), evict)
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
