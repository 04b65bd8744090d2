"""Level 1: the target's weights over a retrieval view draft tokens (exactly its own ``p_hat``, verifying level 0's
drafts exactly); their processed scores are the ``q`` the full cache (level 2) verifies against."""

from __future__ import annotations

import functools
import math
import time

import torch

from ..caches.retrieval import RetrievalCache
from ..caches.slots import SlotMask
from ..config import TriForceConfig
from ..hf.attention import QueryCapture
from ..hf.distributed import RankConsensus
from ..hf.model import layer_windows
from ..stats import TriForceStats, timing_requested
from .calibration import TIMES, CallCosts, level0_drafts, level1_widths, timed
from .drafter import Drafter
from .judge import Drafts, judge_rows, node_scores
from .level1_steps import level1_steps
from .planner import Plan, Planner
from .rows import Row, RowDraft, padded_tokens
from .static_steps import RunnerSlot
from .token_tree import TokenTree
from .tree_shape import TreeShape


class Level1Drafter:
    """Drafts level-1 tokens (with their processed scores) for the full-cache verification, for every row of a call.

    One sequence is a batch of one. One forward serves every row, as wide as the widest row (padding slots are never
    judged); each row keeps its own tokens, level-0 drafter, view chunks (``[B, H_kv, S, D]``) and statistics.
    Call :meth:`observe_prefill`, then per round :meth:`plan_round`, :meth:`draft` and :meth:`observe_verification`.

    Args:
        cache: the target's :class:`~hf_triforce.caches.retrieval.RetrievalCache` (all but each row's last token).
        slots: the full cache's :class:`~hf_triforce.caches.slots.SlotMask` (real tokens and next position per row).
        plan: the call's :class:`~hf_triforce.generation.plan.CallPlan`.
        do_sample: exact speculative sampling, or token matching (greedy).
        drafters: one level-0 :class:`~hf_triforce.hierarchy.drafter.Drafter` per row, or ``None`` (two levels).
        stats: the call's totals; ``row_stats``: one :class:`~hf_triforce.stats.TriForceStats` per row, or ``None``.
        runner_slot: where a static level-1 runner is kept between calls (the model's state), or ``None``.
        costs: the step costs the planner decides with (:func:`~hf_triforce.hierarchy.calibration.step_costs`).

    Example:
        >>> level1 = Level1Drafter(model, cache, slots, TriForceConfig(), plan, False, None, stats)  # doctest: +SKIP
        >>> level1.observe_prefill(capture); plan = level1.plan_round()  # doctest: +SKIP
        >>> drafts = level1.draft(plan, rows, budgets=[6])  # one RowDraft per row  # doctest: +SKIP
    """

    def __init__(
        self, model, cache: RetrievalCache, slots: SlotMask, config: TriForceConfig, plan, do_sample: bool,
        drafters: list[Drafter] | None, stats: TriForceStats, row_stats: list[TriForceStats] | None = None,
        eos_token_ids: list[int] | None = None, runner_slot: RunnerSlot | None = None, costs: CallCosts | None = None,
    ) -> None:  # fmt: skip
        self.model, self.cache, self.slots, self.config = model, cache, slots, config
        self.do_sample, self.drafters = do_sample, drafters
        self.stats, self.row_stats = stats, row_stats
        self.eos_token_ids = set(eos_token_ids or [])
        consensus = RankConsensus.for_model(model)  # rank 0's adaptive decisions, on every rank
        self.windows = layer_windows(model)  # a sliding layer's view keeps to its window
        self.steps = level1_steps(model, cache, config, plan, slots if plan.batched else None, runner_slot)
        self.planner = Planner(
            config,
            drafters is not None,
            consensus,
            one_sequence=plan.rows == 1 and do_sample,
            trees=plan.trees,
            costs=costs,
        )
        self._queries: list[torch.Tensor] | None = None
        self._confidences: list[float] = []  # level 1's probability of each token of the round's drafts (one row)
        self._survival = 1.0  # the estimated chance that all of the round's drafts so far are accepted
        self._round: tuple[float, int] | None = None  # the last round's start and tokens, timed at the next start

    # -- the round -------------------------------------------------------------------------------------------

    def plan_round(self, room: int | None = None) -> Plan:
        """The schedule of the next round (one for every row, from the pooled acceptance and step costs); ``room``:
        the full cache's free slots (:meth:`Planner.plan_round`)."""
        now = time.perf_counter()  # the round's wall clock, for the planner's explanation
        if self._round is not None:
            self.planner.observe_round(self._round[1], now - self._round[0])
        self._round = (now, 0)
        plan = self.planner.plan_round(room)
        self.stats.rounds[plan.kind] = self.stats.rounds.get(plan.kind, 0) + 1
        self.stats.phases.synchronize = self.planner.timing or timing_requested()  # the opening measuring costs
        return plan

    def draft(self, plan: Plan, rows: list[Row], budgets: list[int]) -> list[RowDraft]:
        """Each row's drafts for level 2 under ``plan``, at most ``budgets[b]`` for row ``b``, with level 1's processed
        scores or level 0's log-probabilities (``None``: a deterministic drafter); a ``"plain"`` round drafts none."""
        if plan.kind == "plain" or max(budgets, default=0) <= 0:
            return [RowDraft(row.ids[:0]) for row in rows]
        if plan.kind == "level0":
            return self._level0_drafts(rows, budgets)
        self._prepare_view()
        return self._level1_drafts(rows, budgets)

    def draft_tree(self, shape: TreeShape, row: Row, budget: int) -> TokenTree:
        """One sequence's token tree for level 2, expanded along ``shape`` with one level-1 forward per depth (a tree
        mask over the view). No node at depth ``budget`` gets children, nor an end of sequence."""
        self._prepare_view()
        tree, shape_children = TokenTree.rooted(int(row.ids[-1])), shape.children
        position, forwarded, frontier = int(self.slots.positions[0]), [], [0]
        while frontier:
            internal = [n for n in frontier if self._expands(tree, n, shape_children, budget)]
            if not internal:
                break
            forwarded += internal  # each node sees the view and its ancestors among them, one depth per forward
            depth_tokens = torch.tensor([tree.tokens[n] for n in internal], device=row.ids.device)
            depth_position, start = position + tree.depths[internal[0]], time.perf_counter()
            with self.stats.phases.measure("level1"):
                logits = self.steps.tree_logits(depth_tokens, depth_position, tree.visibility(internal, forwarded))
            self.planner.observe_tree_step(len(internal), time.perf_counter() - start)
            scores = node_scores(row.processors, [tree.context(row.ids, n) for n in internal], logits)
            frontier = []
            for node, node_scores_ in zip(internal, scores, strict=True):
                planned = shape_children[tree.shape_nodes[node]]
                tokens, probs = self._candidates(node_scores_, len(planned))
                tree.draft_probs[node] = probs
                frontier += [tree.add(t, node, planned[rank]) for rank, t in enumerate(tokens)]
        return tree

    def _expands(self, tree: TokenTree, node: int, shape_children: list[list[int]], budget: int) -> bool:
        ended = node > 0 and tree.tokens[node] in self.eos_token_ids
        return bool(shape_children[tree.shape_nodes[node]]) and tree.depths[node] < budget and not ended

    def _candidates(self, scores: torch.Tensor, k: int) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` distinct candidates from processed ``scores`` ``[V]``: the top ones (greedy), or drawn without
        replacement from their softmax, which is returned (sampling); never a token of zero probability."""
        if not self.do_sample:
            k = min(k, int(torch.isfinite(scores).sum()))
            return scores.topk(k).indices.tolist(), None
        probs = scores.float().softmax(-1)
        k = min(k, int((probs > 0).sum()))
        return torch.multinomial(probs, k, replacement=False).tolist(), probs

    def observe_tree(
        self, tree: TokenTree, path: list[int], ranks: list[int], seconds: float, kept: int, capture: QueryCapture
    ) -> None:
        """Record a tree round's verdict: the accepted ``path``, the rank taken at each node visited (``-1``: none);
        ``kept`` of the path's tokens (root first) entered the cache, the newest one's query selects next."""
        self._round = (self._round[0], len(path) + 1)
        self._queries = capture.at(([0] + path)[kept - 1])
        children = tree.children
        counts = [len(children[n]) for n in [0, *path] if children[n]]
        self.planner.observe_tree(ranks, counts, seconds, tree.size)
        self._record(0, "level1", len(ranks), len(path))
        self.stats.tree_rounds += 1
        self.stats.tree_nodes += tree.size

    def observe_prefill(self, capture: QueryCapture) -> None:
        """Keep each row's last prompt query (the prefill's ``capture``) for the first selection."""
        self._queries = capture.at(-1)

    def observe_verification(
        self, plan: Plan, drafted: list[int], accepted: list[int], seconds: float, capture: QueryCapture,
        requested: list[int], rank: int | None = None,
    ) -> None:  # fmt: skip
        """Record row ``b``'s verdict (``accepted[b]`` of ``drafted[b]``, ``requested[b]`` asked for) and keep the
        query of its newest cached token for the next selection; ``rank`` and ``requested``: see
        :meth:`~hf_triforce.hierarchy.planner.Planner.observe_level2`."""
        self._round = (self._round[0], sum(accepted) + len(accepted))
        self._queries = capture.rows_at(accepted)
        confidences = self._confidences if len(accepted) == 1 else None
        level = {"levels": "level1", "level0": "level0_to_level2"}.get(plan.kind)
        self.planner.step(self.planner.level2, max(drafted) + 1, seconds)  # one forward, as wide as the widest row
        for b, (d, a, r) in enumerate(zip(drafted, accepted, requested, strict=True)):
            self.planner.observe_level2(plan, d, a, None, confidences, rank, requested=r)
            if level is not None and d:
                self._record(b, level, d, a)

    def keep_rows(self, rows: torch.Tensor, kept: list[int]) -> None:
        """Only the rows at ``rows`` remain (``kept``: the same as a list); the view is re-selected next round."""
        self._queries = [q[rows] for q in self._queries]
        if self.drafters is not None:
            self.drafters = [self.drafters[i] for i in kept]
        if self.row_stats is not None:
            self.row_stats = [self.row_stats[i] for i in kept]
        self.steps.forget()

    def _record(self, b: int, level: str, drafted: int, accepted: int) -> None:
        getattr(self.stats, level).record(drafted, accepted)
        if self.row_stats is not None:
            getattr(self.row_stats[b], level).record(drafted, accepted)

    # -- the planner's costs ---------------------------------------------------------------------------------

    def calibrate(self, rows: list[Row]) -> None:
        """Time a re-selection, level-1 steps at :func:`~hf_triforce.hierarchy.calibration.level1_widths` and level-0
        proposals of :func:`~hf_triforce.hierarchy.calibration.level0_drafts` into the planner's costs. Nothing of it
        stays: the view is forgotten (the first level-1 round selects its own, from the queries it then has, as in a
        call that does not calibrate; kept, it made the calibrating call's views differ from the next calls' where
        level 0 -> 2 rounds came first, and with them its text) and the drafters start over."""
        costs, device = self.planner.costs, rows[0].ids.device
        costs.refresh.observe(1, timed(self._select_view, device))
        positions = self.slots.positions.tolist()
        for width in level1_widths(self.config, self.drafters is not None, self.planner.trees):
            inputs = torch.stack([row.ids[-1:].repeat(width) for row in rows])
            for _ in range(TIMES):
                costs.level1.observe(width, timed(functools.partial(self.steps.logits, inputs, positions), device))
                self.steps.keep([0] * len(rows), width)
        self.steps.forget()
        if self.drafters is None:
            return
        prefix = rows[0].real_ids()
        for k in level0_drafts(self.config):
            for _ in range(TIMES):  # the first starts over from the prompt, the second catches up one token
                costs.level0.observe(k, timed(functools.partial(self.drafters[0].propose, prefix, k), device))
        self.drafters[0].reset()

    # -- level 0 -> level 2 ----------------------------------------------------------------------------------

    def _level0_drafts(self, rows: list[Row], budgets: list[int]) -> list[RowDraft]:
        drafts = []
        with self.stats.phases.measure("level0"):
            for drafter, row, budget in zip(self.drafters, rows, budgets, strict=True):
                start = time.perf_counter()
                tokens, probs = drafter.propose(row.real_ids(), budget) if budget > 0 else (row.ids[:0], None)
                self.planner.observe_level0(budget, time.perf_counter() - start)
                drafts.append(RowDraft(tokens, None if probs is None else probs.log()))
        return drafts

    # -- level 1 ---------------------------------------------------------------------------------------------

    def _prepare_view(self) -> None:
        view = self.steps.view  # full-cache tokens added since its selection (none yet: select one)
        tail = None if view is None else view.tail_length()
        if tail is not None and tail < self.config.refresh_every:
            self.steps.sync()
            return
        start = time.perf_counter()
        self._select_view()
        self.planner.observe_refresh(time.perf_counter() - start)

    def _select_view(self) -> None:
        with self.stats.phases.measure("refresh"):
            self.steps.select(self._selection())
        self.stats.retrieval_refreshes += 1
        self.stats.view_bytes = max(self.stats.view_bytes, self.steps.view.kv_nbytes())

    def _selection(self) -> list[torch.Tensor]:
        """Per-layer token indices ``[B, H_kv, S]`` of the new view, from each row's newest query."""
        cfg = self.config
        slots = self.steps.slots  # rows with padding or holes: chunks of those only are never preferred
        return self.cache.select(
            self._queries, cfg.retrieval_budget, cfg.recent_tokens, slots, cfg.rescore_candidates, windows=self.windows
        )

    def _level1_drafts(self, rows: list[Row], budgets: list[int]) -> list[RowDraft]:
        drafts = [RowDraft(row.ids[:0]) for row in rows]
        budgets = list(budgets)
        positions = self.slots.positions.tolist()
        reals = [row.real_ids() for row in rows] if self.drafters is not None else None
        self._confidences, self._survival = [], 1.0
        while any(len(d.tokens) < b for d, b in zip(drafts, budgets, strict=True)):
            prefixes = [torch.cat([row.ids, d.tokens]) for row, d in zip(rows, drafts, strict=True)]
            with self.stats.phases.measure("level0"):
                proposals = self._propose(reals, prefixes, drafts, budgets)
            start = time.perf_counter()
            with self.stats.phases.measure("level1"):
                new = self._level1_step(rows, prefixes, proposals, drafts, positions)
            seconds = time.perf_counter() - start
            for (proposal, _), (tokens, _) in zip(proposals, new, strict=True):
                self.planner.observe_level1(proposal.shape[0], tokens.shape[0] - 1, seconds)
            for b, (tokens, scores) in enumerate(new):
                if not self._keep_drafting(tokens, scores, drafts[b].tokens.shape[0]):
                    budgets[b] = min(budgets[b], drafts[b].tokens.shape[0])
            positions = [p + tokens.shape[0] for p, (tokens, _) in zip(positions, new, strict=True)]
        trimmed = []
        for draft, budget in zip(drafts, budgets, strict=True):
            tokens = draft.tokens[: max(budget, 0)]
            trimmed.append(RowDraft(tokens, torch.cat(draft.steps)[: tokens.shape[0]] if draft.steps else None))
        return trimmed

    def _propose(self, reals, prefixes: list[torch.Tensor], drafts: list[RowDraft], budgets: list[int]):
        """Each row's level-0 drafts for this step, ``([k_b] tokens, [k_b, V] probabilities or None)``, leaving room
        for the token level 1 adds."""
        gamma1 = self.planner.gamma1()
        proposals = []
        for b, prefix in enumerate(prefixes):
            k = min(gamma1, budgets[b] - drafts[b].tokens.shape[0] - 1)
            if self.drafters is None or k <= 0:
                proposals.append((prefix[:0], None))
                continue
            start = time.perf_counter()
            proposals.append(self.drafters[b].propose(torch.cat([reals[b], drafts[b].tokens]), k))
            self.planner.observe_level0(k, time.perf_counter() - start)
        return proposals

    def _level1_step(self, rows, prefixes, proposals, drafts, positions) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One forward over every row's ``[last token, drafts, padding]``, judged: each row's new tokens ``[n_b]`` and
        their processed scores ``[n_b, V]``."""
        width = max(p.shape[0] for p, _ in proposals) + 1
        steps = zip(prefixes, proposals, strict=True)
        inputs = torch.stack([padded_tokens(torch.cat([pre[-1:], p]), width) for pre, (p, _) in steps])
        logits = self.steps.logits(inputs, positions)
        cases = [Drafts(pre, p, q, logits[b]) for b, (pre, (p, q)) in enumerate(zip(prefixes, proposals, strict=True))]
        verdicts = judge_rows([row.processors for row in rows], self.do_sample, cases)
        new = []
        for b, ((proposal, _), (accepted, token, scores)) in enumerate(zip(proposals, verdicts, strict=True)):
            self._record(b, "level0", proposal.shape[0], accepted)
            tokens = torch.cat([proposal[:accepted], proposal.new_tensor([token])])
            drafts[b].tokens = torch.cat([drafts[b].tokens, tokens])
            drafts[b].steps.append(scores[: accepted + 1])
            new.append((tokens, scores[: accepted + 1]))
        self.steps.keep([tokens.shape[0] for tokens, _ in new], width)
        return new

    def _keep_drafting(self, tokens: torch.Tensor, scores: torch.Tensor, drafted: int) -> bool:
        """Whether a row drafts on after level 1 drew ``tokens`` ``[n]`` from ``scores`` ``[n, V]``: not after an end
        of sequence, nor when :meth:`~hf_triforce.hierarchy.planner.Planner.keep_drafting` says stop."""
        keep = True
        if self.planner.confidence_stops:
            confidences = scores.float().softmax(-1).gather(-1, tokens[:, None])[:, 0].tolist()
            self._confidences += confidences
            self._survival *= math.prod(self.planner.token_acceptance(c) for c in confidences)
            keep = self.planner.keep_drafting(drafted, self._survival)
        return keep and not self.eos_token_ids.intersection(tokens.tolist())
