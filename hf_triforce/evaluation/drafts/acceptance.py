"""Per-position acceptance of a draft distribution against its verifier, without running the verification.

At ``T = 0`` a level verifies by token matching: a draft is accepted when it is the verifier's argmax, so
the acceptance of a greedy drafter is the argmax agreement of the two distributions.

At ``T > 0`` exact speculative sampling accepts a draft ``x ~ q`` with probability ``min(1, p(x) / q(x))``,
so the probability that the draft at a position is accepted is

    E_{x ~ q}[min(1, p(x) / q(x))] = sum_x min(p(x), q(x)) = 1 - TV(p, q),

exactly the per-token acceptance probability of speculative sampling (Leviathan et al. 2023, the
``alpha`` of TriForce). ``p`` and ``q`` are both taken after the same logits processors
(temperature, top-p) that ``generate()`` applies, as the verification does.

Example:
    >>> p, q = torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[2.0, 0.0, 1.0]])
    >>> acceptance(p, q, temperature=0.0).tolist()
    [1.0]
    >>> round(float(acceptance(p, p, temperature=1.0)), 5)
    1.0
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper


def logits_processors(temperature: float, top_p: float = 1.0) -> LogitsProcessorList:
    """The sampling processors ``generate(do_sample=True, temperature=..., top_p=...)`` applies (none at T=0).

    Example:
        >>> len(logits_processors(0.6, 0.9)), len(logits_processors(0.0))
        (2, 0)
    """
    processors = LogitsProcessorList()
    if temperature > 0:
        if temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
    return processors


def processed_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """``[N, V]`` sampling distributions of ``[N, V]`` raw logits after temperature and top-p (float32).

    These warpers do not look at the previous tokens, so rows are processed independently.

    Example:
        >>> processed_probs(torch.zeros(2, 4), 0.7).sum(-1).tolist()
        [1.0, 1.0]
    """
    if temperature <= 0:
        raise ValueError("processed_probs needs a temperature > 0; at T=0 compare argmaxes.")
    scores = logits.float()
    dummy_ids = torch.zeros(scores.shape[0], 1, dtype=torch.long, device=scores.device)
    return logits_processors(temperature, top_p)(dummy_ids, scores.clone()).softmax(dim=-1)


def acceptance(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Per-row acceptance of a drafter with logits ``q_logits`` verified by logits ``p_logits``.

    Args:
        p_logits: ``[N, V]`` verifier (e.g. full-cache) raw logits.
        q_logits: ``[N, V]`` drafter (e.g. sparse-view) raw logits.
        temperature: 0 for greedy (argmax agreement), else the sampling temperature.
        top_p: nucleus threshold applied to both when sampling.

    Returns:
        ``[N]`` float32: 0/1 argmax agreement at ``T = 0``, ``sum_x min(p(x), q(x))`` at ``T > 0``.

    Example:
        >>> acceptance(torch.tensor([[0.0, 9.0]]), torch.tensor([[0.0, 1.0]]), 0.0).tolist()
        [1.0]
    """
    if temperature <= 0:
        return (p_logits.argmax(dim=-1) == q_logits.argmax(dim=-1)).float()
    p = processed_probs(p_logits, temperature, top_p)
    q = processed_probs(q_logits, temperature, top_p)
    return torch.minimum(p, q).sum(dim=-1)


def token_acceptance(
    p_logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float = 1.0
) -> torch.Tensor:
    """Per-row acceptance of deterministic drafts ``tokens`` (a one-hot ``q``) verified by ``p_logits``.

    Args:
        p_logits: ``[N, V]`` verifier raw logits.
        tokens: ``[N]`` drafted token ids.

    Returns:
        ``[N]``: ``tokens == argmax p`` at ``T = 0``, ``p(token)`` at ``T > 0`` (``min(1, p(x) / 1)``).

    Example:
        >>> token_acceptance(torch.tensor([[0.0, 5.0]]), torch.tensor([1]), 0.0).tolist()
        [1.0]
    """
    if temperature <= 0:
        return (p_logits.argmax(dim=-1) == tokens).float()
    p = processed_probs(p_logits, temperature, top_p)
    return p.gather(1, tokens[:, None])[:, 0]
