"""Level 1 for a batch: every row drafts over its own retrieval view, verifying its own level-0 drafts.

The batched counterpart of :class:`~hf_triforce.hierarchy.level1.Level1Drafter`. One forward serves every row;
what differs per row is kept per row:

* the retrieval view: each row's chunks are selected from that row's own query (the view is ``[B, H_kv, S, D]``,
  its indices differ per row and KV head), and its padding and holes are masked
  (:class:`~hf_triforce.caches.slots.ViewSlots`);
* level 0: one drafter per row, over that row's own tokens; rows draft different numbers of tokens, a forward is
  as wide as the widest row, and a row's padding slots are rejected without being judged (as if never drafted);
* acceptance: a row keeps every token it accepted; its slots after them are holes, masked until the next sync.

Every row's tokens are verified exactly as in the one-sequence case (token matching, or speculative sampling
with residual resampling), so each row's level-1 tokens are distributed exactly as its level-1 ``p_hat``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..caches.retrieval import RetrievalCache
from ..caches.slots import SlotMask, ViewSlots
from ..caches.view import RetrievalView
from ..config import TriForceConfig
from ..hf.attention import QueryCapture, slot_attention
from ..hf.linears import int8_linears, level1_int8_copy
from ..hf.versions import cache_kwargs
from ..stats import TriForceStats
from .drafter import Drafter
from .judge import Drafts, judge_rows
from .planner import Plan, Planner
from .schedule import RefreshRule


@dataclass
class RowDraft:
    """One row's drafts for the full cache: tokens ``[g]`` and the scores ``[g, V]`` they came from (``None``:
    a deterministic level-0 drafter, a one-hot ``q``)."""

    tokens: torch.Tensor
    scores: torch.Tensor | None = None
    steps: list[torch.Tensor] = field(default_factory=list)


class BatchLevel1:
    """Drafts every active row of a batch for its full-cache verification.

    Args:
        model: the target model.
        cache: the batch's full :class:`~hf_triforce.caches.retrieval.RetrievalCache` (``[B, H_kv, L, D]``).
        slots: the cache's :class:`~hf_triforce.caches.slots.SlotMask` (real tokens per row).
        config: the :class:`~hf_triforce.config.TriForceConfig`.
        do_sample: sampling (exact speculative sampling) or greedy (token matching).
        drafters: one level-0 drafter per row, or ``None`` (two levels).
        stats: the call's :class:`~hf_triforce.stats.TriForceStats` (the totals).
        row_stats: one :class:`~hf_triforce.stats.TriForceStats` per row (its own counts).
        eos_token_ids: token ids that end a row (its drafting stops after one).

    Example:
        >>> cfg = TriForceConfig()
        >>> level1 = BatchLevel1(model, cache, slots, cfg, False, None, stats, rows)  # doctest: +SKIP
        >>> level1.observe_prefill(); plan = level1.plan_round()  # doctest: +SKIP
        >>> drafts = level1.draft(plan, rows, budgets=[6, 6])  # one RowDraft per row  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        cache: RetrievalCache,
        slots: SlotMask,
        config: TriForceConfig,
        do_sample: bool,
        drafters: list[Drafter] | None,
        stats: TriForceStats,
        row_stats: list[TriForceStats],
        eos_token_ids: list[int] | None = None,
    ) -> None:
        self.model, self.cache, self.slots, self.config = model, cache, slots, config
        self.do_sample, self.drafters = do_sample, drafters
        self.stats, self.row_stats = stats, row_stats
        self.eos_ids = set(eos_token_ids or [])
        self.capture = QueryCapture()
        self.planner = Planner(config, has_drafter=drafters is not None)
        self.refresh = RefreshRule(config)
        self.view: RetrievalView | None = None
        self.view_slots: ViewSlots | None = None
        self._queries: list[torch.Tensor] | None = None
        self.int8 = level1_int8_copy(config.level1_weights, model)
        for stats in (self.stats, *row_stats):
            stats.level1_weights = "full" if self.int8 is None else "int8"

    # -- the round -------------------------------------------------------------------------------------------

    def plan_round(self) -> Plan:
        """The schedule of the next round (one for the whole batch, from the pooled acceptance and step costs)."""
        plan = self.planner.plan_round()
        self.stats.rounds[plan.kind] = self.stats.rounds.get(plan.kind, 0) + 1
        return plan

    def draft(self, plan: Plan, rows: list, budgets: list[int]) -> list[RowDraft]:
        """Each row's drafts for level 2 under ``plan``: at most ``budgets[b]`` tokens for row ``b``.

        ``rows[b]`` has ``ids`` (``[n]``, its padded tokens so far), ``pad`` (its left padding) and ``processors``
        (its logits processors).
        """
        if plan.kind == "plain" or max(budgets, default=0) <= 0:
            return [RowDraft(row.ids[:0]) for row in rows]
        if self.drafters is not None:
            with self.stats.phases.measure("level0"):
                for drafter, row in zip(self.drafters, rows, strict=True):
                    drafter.commit(row.ids[row.pad :])
        if plan.kind == "level0":
            return self._level0_drafts(rows, budgets)
        self._prepare_view()
        return self._level1_drafts(rows, budgets)

    def observe_prefill(self) -> None:
        """Keep each row's last prompt query (captured during the prefill) for the first selection."""
        self._queries = self.capture.at(-1)

    def observe_verification(self, plan: Plan, drafted: list[int], accepted: list[int], seconds: float) -> None:
        """Record row ``b``'s verdict (``accepted[b]`` of ``drafted[b]``) and keep the query of its newest cached
        token (position ``accepted[b]`` of the verification's inputs) for the next selection."""
        index = torch.tensor(accepted, device=self.capture.queries[0].device)
        rows = torch.arange(index.shape[0], device=index.device)
        self._queries = [self.capture.queries[i][rows, :, index] for i in sorted(self.capture.queries)]
        for b, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
            self.planner.observe_level2(plan, d, a, seconds)
            level = {"levels": "level1", "level0": "level0_to_level2"}.get(plan.kind)
            if level is not None and d:
                getattr(self.stats, level).record(d, a)
                getattr(self.row_stats[b], level).record(d, a)
                if plan.kind == "levels":
                    self.refresh.observe(d, a)

    def keep_rows(self, rows: torch.Tensor, kept: list[int]) -> None:
        """Only the rows at ``rows`` remain (``kept``: the same as a list); the view is re-selected next round."""
        self._queries = [q[rows] for q in self._queries]
        if self.drafters is not None:
            self.drafters = [self.drafters[i] for i in kept]
        self.row_stats = [self.row_stats[i] for i in kept]
        self.view, self.view_slots = None, None

    # -- level 0 -> level 2 ----------------------------------------------------------------------------------

    def _level0_drafts(self, rows: list, budgets: list[int]) -> list[RowDraft]:
        drafts = []
        with self.stats.phases.measure("level0"):
            for drafter, row, budget in zip(self.drafters, rows, budgets, strict=True):
                start = time.perf_counter()
                tokens, probs = drafter.propose(row.ids[row.pad :], budget) if budget > 0 else (row.ids[:0], None)
                self.planner.observe_level0(budget, time.perf_counter() - start)
                drafts.append(RowDraft(tokens, None if probs is None else probs.log()))
        return drafts

    # -- level 1 ---------------------------------------------------------------------------------------------

    def _prepare_view(self) -> None:
        if not self.refresh.due(None if self.view is None else self.view.tail_length()):
            self.view.sync()
            self.view_slots.tail = self.slots.valid[:, self.view.source_length :]
            return
        cfg = self.config
        start = time.perf_counter()
        with self.stats.phases.measure("refresh"):
            indices = self.cache.select(
                self._queries,
                cfg.retrieval_budget,
                cfg.recent_tokens,
                cfg.lookahead_chunks,
                self.slots,
                cfg.rescore_candidates,
            )
            self.view = self.cache.sparse_view(indices, cfg.view_extra_capacity)
            valid = self.slots.valid
            gathered = [valid[:, None].expand(-1, idx.shape[1], -1).gather(-1, idx) for idx in indices]
            self.view_slots = ViewSlots(gathered, valid[:, valid.shape[1] :])
        self.planner.observe_refresh(time.perf_counter() - start)
        self.refresh.selected()
        self.stats.retrieval_refreshes += 1
        self.stats.view_bytes = max(self.stats.view_bytes, self.view.kv_nbytes())

    def _level1_drafts(self, rows: list, budgets: list[int]) -> list[RowDraft]:
        drafts = [RowDraft(row.ids[:0]) for row in rows]
        budgets = list(budgets)
        positions = self.slots.positions.clone()
        while any(len(d.tokens) < b for d, b in zip(drafts, budgets, strict=True)):
            prefixes = [torch.cat([row.ids, d.tokens]) for row, d in zip(rows, drafts, strict=True)]
            with self.stats.phases.measure("level0"):
                proposals = self._propose(rows, prefixes, drafts, budgets)
            start = time.perf_counter()
            with self.stats.phases.measure("level1"):
                kept = self._level1_step(rows, prefixes, proposals, drafts, budgets, positions)
            seconds = time.perf_counter() - start
            for (proposal, _), n in zip(proposals, kept, strict=True):
                self.planner.observe_level1(proposal.shape[0], n - 1, seconds)
            positions += torch.tensor(kept, device=positions.device)
        return [self._trimmed(d, b) for d, b in zip(drafts, budgets, strict=True)]

    def _propose(self, rows: list, prefixes: list[torch.Tensor], drafts: list[RowDraft], budgets: list[int]):
        """Each row's level-0 drafts for this step: ``([k_b] tokens, [k_b, V] probabilities or None)``, no tokens
        for a row whose budget is met."""
        gamma1 = self.planner.gamma1()
        proposals = []
        for b, (row, prefix) in enumerate(zip(rows, prefixes, strict=True)):
            k = min(gamma1, budgets[b] - len(drafts[b].tokens) - 1)
            if self.drafters is None or k <= 0:
                proposals.append((prefix[:0], None))
                continue
            start = time.perf_counter()
            proposals.append(self.drafters[b].propose(prefix[row.pad :], k))
            self.planner.observe_level0(k, time.perf_counter() - start)
        return proposals

    def _level1_step(self, rows, prefixes, proposals, drafts, budgets, positions) -> list[int]:
        """One forward over every row's ``[last token, drafts, padding]``; returns the slots each row keeps."""
        width = max(p.shape[0] for p, _ in proposals) + 1
        steps = zip(prefixes, proposals, strict=True)
        inputs = torch.stack([padded_tokens(torch.cat([pre[-1:], p]), width) for pre, (p, _) in steps])
        logits = self._logits(inputs, positions)
        cases = [Drafts(pre, p, q, logits[b]) for b, (pre, (p, q)) in enumerate(zip(prefixes, proposals, strict=True))]
        verdicts = judge_rows([row.processors for row in rows], self.do_sample, cases)
        kept = []
        for b, ((proposal, _), (accepted, token, scores)) in enumerate(zip(proposals, verdicts, strict=True)):
            k = proposal.shape[0]
            self.stats.level0.record(k, accepted)
            self.row_stats[b].level0.record(k, accepted)
            new = torch.cat([proposal[:accepted], proposal.new_tensor([token])])
            drafts[b].tokens = torch.cat([drafts[b].tokens, new])
            drafts[b].steps.append(scores[: accepted + 1])
            if set(new.tolist()) & self.eos_ids:  # nothing after an end of sequence is worth drafting
                budgets[b] = min(budgets[b], drafts[b].tokens.shape[0])
            kept.append(accepted + 1)
        self.view.crop(self.view_slots.keep(torch.tensor(kept), width))
        return kept

    def _logits(self, inputs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[B, q, V]`` of the target over the views for ``inputs`` ``[B, q]``."""
        q = inputs.shape[1]
        self.view_slots.append(q)
        position_ids = positions[:, None] + torch.arange(q, device=positions.device)
        with slot_attention(self.model, self.view_slots) as slot_kwargs, int8_linears(self.int8):
            out = self.model(
                input_ids=inputs, position_ids=position_ids, use_cache=True, logits_to_keep=q,
                **cache_kwargs(self.view), **slot_kwargs,
            )  # fmt: skip
        return out.logits[:, -q:].float()

    @staticmethod
    def _trimmed(draft: RowDraft, budget: int) -> RowDraft:
        """The first ``budget`` tokens of a row's level-1 drafts, with their scores."""
        scores = torch.cat(draft.steps) if draft.steps else None
        tokens = draft.tokens[: max(budget, 0)]
        return RowDraft(tokens, None if scores is None else scores[: tokens.shape[0]])


def padded_tokens(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """``tokens`` ``[n]`` padded to ``[width]`` with its last token: a row's share of a forward as wide as the
    widest row (its padding slots are never judged, and no row keeps them).

    Example:
        >>> padded_tokens(torch.tensor([4, 5]), 4).tolist()
        [4, 5, 5, 5]
    """
    return torch.cat([tokens, tokens[-1:].expand(width - tokens.shape[0])])
