"""Exact verification rules for speculative decoding (pure functions, no model).

Every level of the TriForce hierarchy verifies the level below it with the same rule
(Leviathan et al. 2023, Chen et al. 2023):

* a drafted token ``x`` drawn from the draft distribution ``q`` is accepted with probability
  ``min(1, p(x) / q(x))``, where ``p`` is the verifier's distribution;
* on the first rejection the next token is drawn from the residual ``norm(max(p - q, 0))``;
* when every draft is accepted, a bonus token is drawn from the verifier's next distribution.

The output then has exactly the verifier's distribution ``p`` whatever ``q`` is. A deterministic
drafter (n-gram lookup) is a one-hot ``q`` and is passed as ``draft_probs=None``. Greedy decoding
is token matching against the verifier's argmax.
"""

from __future__ import annotations

import torch

__all__ = [
    "acceptance_probability",
    "after_rejection",
    "draw",
    "residual_distribution",
    "verify_candidates",
    "verify_greedy",
    "verify_sampled",
    "verify_tree",
]


def acceptance_probability(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tokens: torch.Tensor
) -> torch.Tensor:
    """Probability ``min(1, p(x) / q(x))`` of accepting each drafted token.

    Args:
        target_probs: ``[k, V]`` verifier distributions ``p`` at the drafted positions.
        draft_probs: ``[k, V]`` draft distributions ``q``, or ``None`` for a deterministic (one-hot) drafter.
        tokens: ``[k]`` drafted token ids.

    Returns:
        ``[k]`` acceptance probabilities in ``[0, 1]``.

    A drafted token with ``q(x) == 0`` cannot have been drawn from ``q`` (it can only come from an
    inconsistent drafter or processed ``q``). It is verified as a one-hot draft, accepted with
    probability ``p(x)``, the only rule whose output is exactly ``p`` given ``x`` (accepting it
    outright would emit tokens with ``p(x) == 0``). :func:`residual_distribution` does the same.

    Example:
        >>> p = torch.tensor([[0.5, 0.5]]); q = torch.tensor([[0.25, 0.75]])
        >>> acceptance_probability(p, q, torch.tensor([1]))
        tensor([0.6667])
    """
    p_x = target_probs.gather(-1, tokens[:, None]).squeeze(-1)
    if draft_probs is None:
        return p_x.clamp(max=1.0)
    q_x = draft_probs.gather(-1, tokens[:, None]).squeeze(-1)
    ratio = (p_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny)).clamp(max=1.0)
    return torch.where(q_x > 0, ratio, p_x.clamp(max=1.0))


def residual_distribution(
    target_probs: torch.Tensor, draft_probs: torch.Tensor | None, token: int | None = None
) -> torch.Tensor:
    """The distribution ``norm(max(p - q, 0))`` to resample from after a rejection.

    Args:
        target_probs: ``[V]`` verifier distribution ``p``.
        draft_probs: ``[V]`` draft distribution ``q``, or ``None`` for a one-hot draft at ``token``.
        token: the rejected token; required when ``draft_probs`` is ``None``. When given and
            ``draft_probs[token] == 0``, the draft is treated as one-hot at ``token`` (see
            :func:`acceptance_probability`).

    Returns:
        ``[V]`` probabilities summing to 1. When ``p == q`` (rejection has probability zero) ``p`` is returned.

    Example:
        >>> residual_distribution(torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))
        tensor([1., 0.])
    """
    if draft_probs is None or (token is not None and not bool(draft_probs[token] > 0)):
        if token is None:
            raise ValueError(
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
    """Greedy verification: accept drafts while they equal the verifier's argmax.

    Args:
        draft_tokens: ``[k]`` drafted token ids.
        target_scores: ``[k + 1, V]`` processed verifier scores (logits after the logits processors).

    Returns:
        ``(n_accepted, next_token)``: the number of leading drafts accepted and the verifier's token
        that follows them (the correction at the first mismatch, or the bonus token).

    Example:
        >>> verify_greedy(torch.tensor([1, 0]), torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]))
        (1, 1)
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

    Args:
        draft_tokens: ``[k]`` drafted token ids.
        draft_probs: ``[k, V]`` draft distributions, or ``None`` for a deterministic drafter.
        target_probs: ``[k + 1, V]`` verifier distributions (softmax of processed scores).
        generator: optional ``torch.Generator``; the global RNG is used by default, as in ``generate()``.

    Returns:
        ``(n_accepted, next_token)``: leading drafts accepted, then the token drawn from the residual
        at the first rejection or from ``target_probs[k]`` when all drafts were accepted.

    Example:
        >>> p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
        >>> verify_sampled(torch.tensor([1]), None, p)
        (1, 0)
    """
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
    """Exact multi-candidate speculative sampling (SpecInfer/Sequoia): the returned token has exactly the verifier's
    distribution ``p`` when ``candidates`` were drawn one after another *without replacement* from ``q``.

    Candidate ``i`` is accepted with probability ``min(1, p(c_i) / q(c_i))``; on its rejection ``p`` becomes the
    residual ``norm(max(p - q, 0))`` and ``q`` loses ``c_i`` (renormalized: the distribution ``c_{i+1}`` was drawn
    from). Each step is the one-candidate rule against the current ``p``, so whatever is returned after ``i``
    rejections is distributed as that ``p``, by induction as the original ``p``. When every candidate is rejected the
    token is drawn from the last residual.

    Args:
        target_probs: ``[V]`` verifier distribution ``p``.
        draft_probs: ``[V]`` the distribution ``q`` the candidates were drawn from, without replacement.
        candidates: the drawn tokens, in the order they were drawn.
        generator: optional ``torch.Generator`` (the global RNG by default).

    Returns:
        ``(index of the accepted candidate or -1, token)``.

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
    """The verifier's and the draft's distributions for the next candidate once ``token`` was rejected: the residual
    ``norm(max(p - q, 0))``, and ``q`` without ``token`` renormalized (``None`` when nothing is left to draw).

    Example:
        >>> p, q = after_rejection(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.5, 0.25]), 2)
        >>> p.tolist(), [round(x, 4) for x in q.tolist()]
        ([1.0, 0.0, 0.0], [0.3333, 0.6667, 0.0])
    """
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
    """Verify a token tree from its root: greedy token matching (``draft_probs=None``) or exact multi-candidate
    speculative sampling (:func:`verify_candidates`) at each node on the way down.

    Node 0 is the root (the last token already decided); a node's children are its candidate next tokens, in the
    order they were drawn from the draft's distribution at that node (without replacement when sampling).

    Args:
        tokens: ``[N]`` each node's token.
        children: each node's children (node indices), in drawing order.
        target_scores: ``[N, V]`` the verifier's processed scores after each node (greedy), or its probabilities
            (sampling).
        draft_probs: ``[N, V]`` the draft's distribution at each node (what its children were drawn from), or
            ``None`` for greedy verification.
        generator: optional ``torch.Generator``.

    Returns:
        ``(accepted nodes from the root down, the verifier's next token, the rank accepted at each node visited
        with candidates, -1 where none was)``.

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
    """One token drawn from ``probs`` ``[V]`` (non-negative, not necessarily normalized).

    The draw is among the non-zero entries only: the same distribution as ``torch.multinomial(probs, 1)``, but
    after top-k/top-p or in a residual a few hundred entries cost far less to draw from than ``V`` (the CPU's
    multinomial costs about 1 ms over 49K entries, whatever their values).

    Example:
        >>> draw(torch.tensor([0.0, 0.0, 1.0, 0.0]))
        2
    """
    support = probs.nonzero().squeeze(-1)
    if support.numel() == probs.numel():
        return int(torch.multinomial(probs, num_samples=1, generator=generator))
    return int(support[torch.multinomial(probs[support], num_samples=1, generator=generator)])


def _at_least_float32(probs: torch.Tensor) -> torch.Tensor:
    return probs.float() if torch.finfo(probs.dtype).bits < 32 else probs
