"""Level-1 acceptance of a view policy along a reference continuation, without running the hierarchy.

For every position ``j >= 1`` of a :class:`~hf_triforce.evaluation.drafts.reference.Reference` (``y_0`` comes from
the prefill, not from level 1), level 1 feeds ``y_{j-1}`` at its true position over its view of the
``n + j - 1`` cached tokens: the tokens chosen at the last selection plus every token cached since
(exact full-cache keys/values, as ``RetrievalView.sync`` gives). Its logits ``p_hat`` are compared with
the full cache's ``p`` by :func:`~hf_triforce.evaluation.drafts.acceptance.acceptance`; every position is measured
once.

The view follows :class:`~hf_triforce.hierarchy.Level1Drafter`'s rounds, replayed along the reference: a round drafts
``gamma2`` positions over one view, the full cache accepts them up to the first rejection and adds one
token, and the next round starts after it. Before each round the selection is redone (with the query of
the newest cached token) once ``refresh_every`` tokens have been cached since the last one, or after a
round whose acceptance (accepted / drafted) fell below ``refresh_below_acceptance`` (the package's
:class:`~hf_triforce.hierarchy.schedule.RefreshRule`). At ``T = 0`` rejections are
argmax disagreements, so the replay is exact; at ``T > 0`` a draft is accepted with its probability
``sum min(p, p_hat)`` (seeded coin flips). One simplification: inside a round every position sees exact
keys/values for the earlier tokens of the round (the generator computes its own drafts' over the view).
The replay also yields the generator's own statistic, accepted / drafted per round
(``TriForceStats.level1.acceptance_rate``), which counts every draft after a rejection as rejected.

Example:
    >>> m = measure_view(model, cache, ref, ViewPolicy(budget=512))  # doctest: +SKIP
    >>> m.mean, m.accepted / m.drafted  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...caches.retrieval import RetrievalCache
from ...stats import LevelStats
from .acceptance import acceptance
from .reference import Reference
from .view_forward import DEFAULT_MAX_ROWS, view_logits
from .view_policy import ViewPolicy, select_indices


@dataclass
class ViewMeasurement:
    """Level-1 acceptance of one policy along one reference.

    Attributes:
        acceptance: ``[m - 1]`` per-position acceptance (positions ``1 .. m - 1``).
        refreshes: selections made.
        view_tokens: mean tokens visible to level 1 (selection + tail).
        accepted: level-1 drafts accepted in the replayed rounds.
        drafted: level-1 drafts in the replayed rounds.
        rejections: replayed rounds that ended with a rejected draft.
        logits: ``[m - 1, V]`` level-1 logits when kept (for the level-0 comparison), else None.
    """

    acceptance: torch.Tensor
    refreshes: int
    view_tokens: float
    accepted: int = 0
    drafted: int = 0
    logits: torch.Tensor | None = None
    rejections: int = 0

    @property
    def mean(self) -> float:
        """Mean per-position acceptance."""
        return float(self.acceptance.mean()) if self.acceptance.numel() else float("nan")

    @property
    def per_token(self) -> float:
        """Per-token acceptance of the replayed rounds, ``accepted / (accepted + rejections)``: the estimate
        :attr:`hf_triforce.stats.LevelStats.per_token_acceptance` reports."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else float("nan")


@dataclass
class RoundOutcome:
    """One replayed round: positions kept, drafts accepted and drafted."""

    keep: int
    accepted: int
    drafted: int


def measure_view(
    model,
    cache: RetrievalCache,
    ref: Reference,
    policy: ViewPolicy,
    top_p: float = 1.0,
    gamma2: int = 6,
    keep_logits: bool = False,
    max_rows: int = DEFAULT_MAX_ROWS,
    seed: int = 0,
) -> ViewMeasurement:
    """Per-position level-1 acceptance of ``policy`` along ``ref`` (at ``ref.temperature``).

    Args:
        model: the target model.
        cache: the full cache holding ``ref``'s prompt and continuation (all but its last token).
        ref: the reference continuation.
        policy: the view policy.
        top_p: nucleus threshold of the reference's sampling.
        gamma2: level-1 drafts per round.
        keep_logits: also return the level-1 logits.
        max_rows: positions per batched forward.
        seed: seed of the accept/reject draws of the rounds at ``T > 0``.

    Returns:
        a :class:`ViewMeasurement`.
    """
    n, m = ref.prompt_length, ref.tokens.shape[0]
    coins = torch.Generator().manual_seed(seed)
    rates, logits, visible = [], [], 0
    selection, selected_at, refreshes, rule = None, 0, 0, policy.refresh_rule()
    rounds = LevelStats()  # the replayed rounds, counted as the generator counts its own
    j = 1
    while j < m:
        length = n + j - 1  # cached tokens when level 1 feeds y_{j-1}
        if rule.due(None if selection is None else length - selected_at):
            selection, selected_at = select_indices(cache, ref.query(j - 1), length, policy), length
            rule.selected()
            refreshes += 1
        stop = min(m, j + gamma2 + 1)  # the round's drafts and the position of the full cache's own token
        lengths = torch.arange(n + j - 1, n + stop - 1)
        step_logits = view_logits(model, cache, selection, selected_at, lengths, ref.tokens[j - 1 : stop - 1], max_rows)
        step_rates = acceptance(ref.logits[j:stop], step_logits, ref.temperature, top_p)
        done = replay_round(step_rates, min(gamma2, m - j - 1), ref.temperature, coins)
        rates.append(step_rates[: done.keep])
        visible += int((selection[0].shape[-1] + lengths[: done.keep] - selected_at).sum())
        if keep_logits:
            logits.append(step_logits[: done.keep])
        rounds.record(done.drafted, done.accepted)
        rule.observe(done.drafted, done.accepted)
        j += done.keep
    per_position = torch.cat(rates) if rates else torch.empty(0)
    kept = torch.cat(logits) if keep_logits and logits else None
    view_tokens = visible / max(1, m - 1)
    return ViewMeasurement(
        per_position, refreshes, view_tokens, rounds.accepted, rounds.drafted, kept, rounds.rejections
    )


def replay_round(rates: torch.Tensor, gamma2: int, temperature: float, coins: torch.Generator) -> RoundOutcome:
    """Which of a round's positions ``rates`` ``[<= gamma2 + 1]`` are accepted, and how many it keeps.

    The drafts are the first ``gamma2`` positions (the caller passes fewer near the end: like the generator,
    level 1 never drafts the last token of the continuation); the round keeps them up to the first rejection
    plus the position after (the rejected one, or the full cache's own token when all are accepted).

    Example:
        >>> replay_round(torch.tensor([1.0, 1.0, 0.0, 1.0]), 3, 0.0, torch.Generator())
        RoundOutcome(keep=3, accepted=2, drafted=3)
    """
    drafts = rates[: max(gamma2, 0)]
    accepts = drafts > 0.5 if temperature <= 0 else torch.rand(drafts.shape, generator=coins) < drafts
    leading = int(torch.cumprod(accepts.int(), dim=0).sum())
    return RoundOutcome(keep=min(leading + 1, rates.shape[0]), accepted=leading, drafted=drafts.shape[0])
