"""Exact verification rules for speculative decoding (pure functions, no model).

Every level verifies the one below (Leviathan et al. 2023, Chen et al. 2023): a draft ``x ~ q`` is accepted with
probability ``min(1, p(x) / q(x))``; the first rejection resamples from ``norm(max(p - q, 0))``; if all are accepted a
bonus token comes from ``p``. The output has exactly the verifier's distribution ``p``. A deterministic drafter is a
one-hot ``q`` (``draft_probs=None``); greedy decoding matches the verifier's argmax.
"""

from __future__ import annotations

import torch

from .errors import InvalidInputError

__all__ = [
    "acceptance_probability", "after_rejection", "draw", "residual_distribution", "verify_candidates",
    "verify_greedy", "verify_sampled", "verify_tree",
]  # fmt: skip


def acceptance_probability(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tokens: torch.Tensor
) -> torch.Tensor:
    """``[k]`` probabilities ``min(1, p(x) / q(x))`` of accepting drafted ``tokens`` ``[k]``.

    ``target_probs``, ``draft_probs``: ``[k, V]``; ``draft_probs=None`` for a one-hot drafter. A token with
    ``q(x) == 0`` cannot come from ``q``: it is verified as a one-hot draft (accepted with probability ``p(x)``, the
    only rule that keeps the output exactly ``p``), as in :func:`residual_distribution`."""
    p_x = target_probs.gather(-1, tokens[:, None]).squeeze(-1)
    if draft_probs is None:
        return p_x.clamp(max=1.0)
    q_x = draft_probs.gather(-1, tokens[:, None]).squeeze(-1)
    ratio = (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)
    return torch.where(q_x > 0, ratio, p_x.clamp(max=1.0))


def residual_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, token: int | None = None
) -> torch.Tensor:
    """The distribution ``norm(max(p - q, 0))`` ``[V]`` to resample from after a rejection (``p`` if ``p == q``).

    ``draft_probs`` ``None``, or zero at ``token``, means a one-hot draft at the rejected ``token``; raises
    ``ValueError`` if ``draft_probs`` is ``None`` without a ``token``."""
    if draft_probs is None or (token is not None and not bool(draft_probs[token] > 0)):
        if token is None:
            raise InvalidInputError(
                "residual_distribution needs the rejected `token` when `draft_probs` is None (one-hot draft)."
            )
        draft_probs = torch.zeros_like(target_probs)
        draft_probs[token] = 1.0
    residual = (target_probs - draft_probs).clamp(min=0.0)
    total = residual.sum()
    if total <= 0:
        return target_probs
    return residual / total


def verify_greedy(draft_tokens: torch.Tensor, target_scores: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: accept drafts ``[k]`` while they equal the argmax of ``target_scores`` ``[k + 1, V]``.

    Returns ``(n_accepted, next_token)``: the verifier's token after the accepted drafts (the correction or the bonus).
    """
    choice = target_scores.argmax(dim=-1)
    k = draft_tokens.shape[0]
    mismatch = (draft_tokens != choice[:k]).nonzero()
    n_accepted = int(mismatch[0, 0]) if mismatch.numel() else k
    return n_accepted, int(choice[n_accepted])


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Exact speculative sampling: the returned tokens have exactly the verifier's distribution.

    ``draft_tokens`` ``[k]``, ``draft_probs`` ``[k, V]`` (``None``: a one-hot drafter), ``target_probs`` ``[k + 1, V]``
    (softmax of processed scores); the global RNG by default, as in ``generate()``. Returns ``(n_accepted,
    next_token)``, the token drawn from the residual at the first rejection, or from ``target_probs[k]``."""
    # Half-precision probabilities are verified in float32: a bfloat16 ratio p/q and bfloat16 uniform
    # draws (256 levels near 1) would bias the acceptance test by up to ~2**-8.
    target_probs = _at_least_float32(target_probs)
    draft_probs = None if draft_probs is None else _at_least_float32(draft_probs)
    k = draft_tokens.shape[0]
    accept = acceptance_probability(target_probs[:k], draft_probs, draft_tokens)
    draws = torch.rand(k, generator=generator, device=target_probs.device, dtype=accept.dtype)
    rejected = (draws >= accept).nonzero()
    if rejected.numel() == 0:
        return k, draw(target_probs[k], generator)
    i = int(rejected[0, 0])
    q_i = None if draft_probs is None else draft_probs[i]
    return i, draw(residual_distribution(target_probs[i], q_i, int(draft_tokens[i])), generator)


def verify_candidates(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    candidates: list[int],
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Exact multi-candidate speculative sampling (SpecInfer/Sequoia) of ``candidates`` drawn without replacement.

    Candidate ``c_i`` is accepted with probability ``min(1, p(c_i) / q(c_i))``; on rejection ``p`` becomes the residual
    and ``q`` loses ``c_i`` (renormalized), so each step is the one-candidate rule and the result has exactly the
    distribution ``p`` (``p``, ``q``: ``[V]``). Returns ``(index of the accepted candidate or -1, token)``; after
    rejecting all, the token is drawn from the residual.

    Example:
        >>> p = torch.tensor([0.0, 1.0, 0.0]); q = torch.tensor([0.5, 0.3, 0.2])
        >>> verify_candidates(p, q, [0, 1])  # candidate 0 has p = 0: rejected; candidate 1 then has p = 1
        (1, 1)
    """
    p, q = _at_least_float32(target_probs), _at_least_float32(draft_probs)
    for i, token in enumerate(candidates):
        accept = acceptance_probability(p[None], q[None], p.new_tensor([token], dtype=torch.long))[0]
        if torch.rand((), generator=generator, device=p.device, dtype=p.dtype) < accept:
            return i, token
        p, q = after_rejection(p, q, token)
        if q is None:
            break
    return -1, draw(p, generator)


def after_rejection(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, token: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The next candidate's ``p`` and ``q`` once ``token`` was rejected: the residual, and ``q`` without ``token``
    renormalized (``None`` when nothing is left)."""
    residual = residual_distribution(target_probs, draft_probs, token)
    rest = draft_probs.clone()
    rest[token] = 0.0
    total = rest.sum()
    return residual, (rest / total if total > 0 else None)


def verify_tree(
    tokens: torch.Tensor,
    children: list[list[int]],
    target_scores: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[list[int], int, list[int]]:
    """Verify a token tree from its root: greedy matching (``draft_probs=None``) or :func:`verify_candidates` per node.

    Node 0 is the root (the last decided token); ``children[n]``: node ``n``'s children, in drawing order (without
    replacement when sampling); ``tokens`` ``[N]``; ``target_scores`` ``[N, V]``: the verifier's processed scores
    (greedy) or probabilities after each node; ``draft_probs`` ``[N, V]``: what each node's children were drawn from.
    Returns the accepted nodes from the root down, the verifier's next token, and the rank accepted at each node visited
    with candidates (-1 where none was).

    Example:
        >>> tokens = torch.tensor([7, 1, 2]); children = [[1, 2], [], []]
        >>> scores = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        >>> verify_tree(tokens, children, scores)  # the root's argmax is 2: its second child
        ([2], 1, [1])
    """
    node, path, ranks = 0, [], []
    while True:
        kids = children[node]
        if draft_probs is None:
            token = int(target_scores[node].argmax())
            matches = [i for i, kid in enumerate(kids) if int(tokens[kid]) == token]
            rank = matches[0] if matches else -1
        elif kids:
            candidates = [int(tokens[kid]) for kid in kids]
            rank, token = verify_candidates(target_scores[node], draft_probs[node], candidates, generator)
        else:
            rank, token = -1, draw(_at_least_float32(target_scores[node]), generator)
        if kids:
            ranks.append(rank)
        if rank < 0:
            return path, token, ranks
        node = kids[rank]
        path.append(node)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token drawn from ``probs`` ``[V]`` (non-negative, not necessarily normalized), as ``torch.multinomial``.

    Drawn among the non-zero entries only: after top-k/top-p or in a residual that is far cheaper than over ``V``."""
    support = probs.nonzero().squeeze(-1)
    if support.numel() == probs.numel():
        return int(torch.multinomial(probs, num_samples=1, generator=generator))
    return int(support[torch.multinomial(probs[support], num_samples=1, generator=generator)])


def _at_least_float32(probs: torch.Tensor) -> torch.Tensor:
    return probs.float() if torch.finfo(probs.dtype).bits < 32 else probs
