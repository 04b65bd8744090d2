"""Level 1 of the hierarchy: the target's weights over a retrieval view draft tokens for the full cache.

Level 1 runs the *target* model over a sparse view of its own KV cache (a ``retrieval_budget``-token
:class:`~hf_triforce.caches.view.RetrievalView`), for every row of a call at once (one sequence is a batch of one).
Each round it produces up to ``gamma2`` tokens per row: with a level-0 drafter it verifies ``gamma1``-token drafts
exactly (token matching, or speculative sampling with residual resampling), so every level-1 token is distributed
exactly as level 1's own ``p_hat``; without one, it decodes one token per step. It returns those tokens with their
processed ``p_hat`` scores, which is the ``q`` that the full cache (level 2) verifies against. How its forwards run
is a strategy chosen once per call (:mod:`~hf_triforce.hierarchy.level1_steps`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..caches.chunk_swap import nominate
from ..caches.retrieval import RetrievalCache
from ..caches.slots import SlotMask
from ..config import TriForceConfig
from ..errors import TriForceConfigError, UnsupportedDeviceError
from ..hf.attention import QueryCapture
from ..hf.direct_forward import direct_decoder, resolve_level1_forward
from ..hf.distributed import RankConsensus
from ..hf.linears import int4_weight_copy, int8_weight_copy, resolve_level1_weights
from ..hf.model import attn_implementation, layer_windows
from ..stats import TriForceStats
from .drafter import Drafter
from .judge import Drafts, judge_rows, node_scores
from .level1_steps import DirectSteps, ModelSteps, StaticSteps
from .model_drafter import ModelDrafter
from .planner import Plan, Planner
from .schedule import RefreshRule
from .static_steps import RunnerSlot, StepMode, planned_step_mode, resolve_step_mode
from .token_tree import TokenTree
from .tree_shape import TreeShape


def runs_direct_forward(config: TriForceConfig, model: torch.nn.Module, step_mode: StepMode | None = None) -> bool:
    """Whether level 1 runs its :class:`~hf_triforce.hf.direct_forward.DirectDecoder` (on the dynamic-shape path
    only) rather than the model's own forward: the one rule :class:`Level1Drafter` follows and the call's checks
    before any work (:func:`~hf_triforce.generation.call.prepare_triforce_call`) ask.

    ``step_mode``: how ``config.cuda_graphs`` resolved for ``model``
    (:func:`~hf_triforce.hierarchy.static_steps.resolve_step_mode`); when ``None``, the mode it plans
    (:func:`~hf_triforce.hierarchy.static_steps.planned_step_mode`: a mode the model cannot run is refused later,
    by :class:`Level1Drafter`, or with a batch's other problems).

    Raises:
        UnsupportedDeviceError: ``level1_forward='direct'`` while the steps are static (``cuda_graphs='auto'`` on a
            GPU resolves to CUDA graphs).

    Example:
        >>> runs_direct_forward(TriForceConfig(), torch.nn.Linear(2, 2))  # no decoder layers: transformers' forward
        False
    """
    step_mode = planned_step_mode(config.cuda_graphs, model) if step_mode is None else step_mode
    choice = config.level1_forward
    if step_mode != "dynamic" and choice == "direct":
        raise UnsupportedDeviceError(
            f"TriForceConfig(level1_forward='direct') runs level 1 on the dynamic-shape path, but cuda_graphs="
            f"{config.cuda_graphs!r} resolved to {step_mode!r} steps here: pass cuda_graphs=False, or "
            "level1_forward='auto'."
        )
    return step_mode == "dynamic" and resolve_level1_forward(choice, model) == "direct"


def level1_weights(config: TriForceConfig, model: torch.nn.Module, direct: bool) -> str:
    """The weights level 1 drafts with (:func:`~hf_triforce.hf.linears.resolve_level1_weights`) when it runs its
    direct forward (``direct``) or transformers' forward; raises :class:`~hf_triforce.errors.UnsupportedDeviceError`
    where they cannot run.

    Example:
        >>> level1_weights(TriForceConfig(), torch.nn.Linear(16, 4), direct=False)
        'int8'
    """
    return resolve_level1_weights(config.level1_weights, model, direct=direct)


def step_selection(config: TriForceConfig, direct: bool) -> bool:
    """Whether every layer of every level-1 forward re-ranks its view's chunks with its own query
    (``TriForceConfig.step_selection``, see :class:`~hf_triforce.caches.chunk_swap.ChunkSwapper`) when level 1 runs
    its direct forward (``direct``) or transformers'; raises :class:`~hf_triforce.errors.UnsupportedDeviceError` for
    ``True`` without the direct forward (the re-ranking runs inside it, between a layer's query and its attention).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():  # step_selection is deprecated (removed in 0.3)
        ...     warnings.simplefilter("ignore", FutureWarning)
        ...     on = TriForceConfig(step_selection=True)
        >>> step_selection(TriForceConfig(), direct=True), step_selection(on, True)
        (False, True)
    """
    if config.step_selection is True and not direct:
        raise UnsupportedDeviceError(
            "TriForceConfig(step_selection=True) ranks the chunks inside level 1's direct forward, per layer (one "
            f"sequence, dynamic steps), and level 1 runs transformers' forward here (level1_forward="
            f"{config.level1_forward!r}, cuda_graphs={config.cuda_graphs!r}): use step_selection=False."
        )
    return config.step_selection


def level1_steps(
    model: torch.nn.Module,
    cache: RetrievalCache,
    config: TriForceConfig,
    masked_slots: SlotMask | None,
    stats: TriForceStats,
    runner_slot: RunnerSlot | None = None,
) -> ModelSteps:
    """The storage/step strategy level 1 runs for this call (:mod:`~hf_triforce.hierarchy.level1_steps`), its
    forward and weights recorded in ``stats``.

    Static steps where ``config.cuda_graphs`` resolves to them; else, for one unpadded row (``masked_slots=None``),
    the direct forward where it runs; else transformers' forward. Rows with padding or holes (``masked_slots``)
    attend through their slots on either storage.

    Example:
        >>> steps = level1_steps(model, cache, TriForceConfig(), None, TriForceStats())  # doctest: +SKIP
        >>> type(steps).__name__  # a CPU model of a Llama-family layout  # doctest: +SKIP
        'DirectSteps'
    """
    mode = resolve_step_mode(config.cuda_graphs, model, "target model")
    direct = masked_slots is None and runs_direct_forward(config, model, mode)
    weights = level1_weights(config, model, direct)
    stats.step_selection = step_selection(config, direct)
    stats.level1_weights, stats.level1_forward = weights, "direct" if direct else "transformers"
    if direct:
        return DirectSteps(model, cache, config, direct_decoder(model, weights), stats)
    low_bit = {"int8": int8_weight_copy, "int4": int4_weight_copy}.get(weights)
    copy = None if low_bit is None else low_bit(model)
    if mode != "dynamic":
        return StaticSteps(model, cache, config, masked_slots, copy, mode, runner_slot)
    return ModelSteps(model, cache, config, masked_slots, copy)


@dataclass
class RowDraft:
    """One row's drafts for the full cache: tokens ``[g]`` and the scores ``[g, V]`` they came from (``None``:
    a deterministic level-0 drafter, a one-hot ``q``)."""

    tokens: torch.Tensor
    scores: torch.Tensor | None = None
    steps: list[torch.Tensor] = field(default_factory=list)


class Level1Drafter:
    """Drafts level-1 tokens (with their processed scores) for the full-cache verification, for every row of a call.

    One sequence is a batch of one. One forward serves every row; what differs per row is kept per row: its tokens,
    its level-0 drafter, its view's chunks (selected from its own query; a view is ``[B, H_kv, S, D]``) and its
    statistics. Rows draft different numbers of tokens: a forward is as wide as the widest row, and a row's padding
    slots are never judged. Every row's tokens are verified exactly (token matching, or speculative sampling with
    residual resampling), so each row's level-1 tokens are distributed exactly as its level-1 ``p_hat``.

    Driven by :mod:`hf_triforce.generation`: :meth:`observe_prefill` after the prefill, then per round
    :meth:`plan_round`, :meth:`draft` before the full-cache verification and :meth:`observe_verification` after it
    (:meth:`keep_rows` when rows leave). The full cache's forwards run inside
    :func:`~hf_triforce.hf.attention.capturing_queries` with :attr:`capture`, which keeps the queries each
    re-selection scores the chunks with. How level 1's forwards run (transformers' forward, the direct forward, fixed
    shapes and CUDA graphs) is the call's :func:`level1_steps` strategy.

    Args:
        model: the target model.
        cache: the target's :class:`~hf_triforce.caches.retrieval.RetrievalCache` (every token but the last of each
            row).
        slots: the full cache's :class:`~hf_triforce.caches.slots.SlotMask` (real tokens and next position per row).
        config: the :class:`~hf_triforce.config.TriForceConfig`.
        do_sample: sampling (exact speculative sampling) or greedy (token matching).
        drafters: one level-0 :class:`~hf_triforce.hierarchy.drafter.Drafter` per row, or ``None`` (two levels).
        stats: the call's :class:`~hf_triforce.stats.TriForceStats` (the totals).
        row_stats: one :class:`~hf_triforce.stats.TriForceStats` per row (each row's own counts), or ``None``.
        eos_token_ids: token ids that end a row (its drafting stops after one).
        masked: rows carry padding or holes (a batch, a left-padded row): attention goes through the slots.
        runner_slot: where a static level-1 runner is kept between calls (the model's state), or ``None``.

    Example:
        >>> level1 = Level1Drafter(model, cache, slots, TriForceConfig(), False, None, stats)  # doctest: +SKIP
        >>> level1.observe_prefill(); plan = level1.plan_round()  # doctest: +SKIP
        >>> drafts = level1.draft(plan, rows, budgets=[6])  # one RowDraft per row  # doctest: +SKIP
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
        row_stats: list[TriForceStats] | None = None,
        eos_token_ids: list[int] | None = None,
        masked: bool = False,
        runner_slot: RunnerSlot | None = None,
    ) -> None:
        self.model, self.cache, self.slots, self.config = model, cache, slots, config
        self.do_sample, self.drafters = do_sample, drafters
        self.stats, self.row_stats = stats, row_stats
        self.eos_token_ids = set(eos_token_ids or [])
        self.capture = QueryCapture()
        rows = slots.valid.shape[0]
        consensus = RankConsensus.for_model(model)  # one sequence: its rounds may stop by confidence (not under TP)
        self.refresh = RefreshRule(config)
        self.windows = layer_windows(model)  # a sliding layer's view keeps to its window
        self.steps = level1_steps(model, cache, config, slots if masked else None, stats, runner_slot)
        trees = self._tree_problem(masked or rows > 1, consensus) is None
        self.planner = Planner(
            config, has_drafter=drafters is not None, consensus=consensus, one_sequence=rows == 1, trees=trees
        )
        for row in row_stats or ():
            row.level1_weights, row.level1_forward = stats.level1_weights, stats.level1_forward
        self._queries: list[torch.Tensor] | None = None
        self._confidences: list[float] = []  # level 1's probability of each token of the round's drafts (one row)
        self._survival = 1.0  # the estimated chance that all of the round's drafts so far are accepted
        self._round: tuple[float, int] | None = None  # the last round's start and tokens, timed at the next start
        if drafters is not None:
            for drafter in drafters:
                if isinstance(drafter, ModelDrafter):
                    draft_mode = resolve_step_mode(config.cuda_graphs, drafter.model, "draft model")
                    drafter.use_static_steps(draft_mode, strict=config.cuda_graphs is True)

    def _tree_problem(self, batch: bool, consensus: RankConsensus) -> str | None:
        """Why this call cannot draft token trees (``None``: it can); raises for an explicit ``tree_budget=N``."""
        problem = None
        if batch:
            problem = "a batch (or a left-padded row) verifies chains: trees need one unpadded sequence"
        elif any(window is not None for window in self.windows):
            problem = "the model has sliding-window layers, and a tree's mask covers full attention only"
        elif attn_implementation(self.model) not in ("sdpa", "eager"):
            problem = f"trees attend through sdpa or eager attention, not {attn_implementation(self.model)!r}"
        elif isinstance(self.steps, StaticSteps):
            problem = "level 1 runs fixed shapes (cuda_graphs), and a tree's frontier changes width"
        elif self.stats.step_selection:
            problem = "step_selection re-ranks chunks inside chain steps"
        elif consensus.active:
            problem = "tensor-parallel ranks agree on chains only"
        if problem is not None and self.config.tree_budget not in (0, "auto"):
            raise TriForceConfigError(
                f"TriForceConfig(tree_budget={self.config.tree_budget}) cannot run here: {problem}. Use "
                "tree_budget='auto' (chains where trees cannot run) or 0."
            )
        return problem

    # -- the round -------------------------------------------------------------------------------------------

    def plan_round(self) -> Plan:
        """The schedule of the next round (one for every row, from the pooled acceptance and step costs)."""
        self._time_round()
        plan = self.planner.plan_round()
        self.stats.rounds[plan.kind] = self.stats.rounds.get(plan.kind, 0) + 1
        return plan

    def draft(self, plan: Plan, rows: list, budgets: list[int]) -> list[RowDraft]:
        """Each row's drafts for level 2 under ``plan``: at most ``budgets[b]`` tokens for row ``b``.

        ``rows[b]`` has ``ids`` (``[n]``, its tokens so far as plain ``generate()`` lays them out, padding included),
        ``real_ids()`` (its tokens without padding: what level 0 drafts from) and ``processors`` (its logits
        processors). Who drafts is the plan's: level 1 (over the retrieval view,
        verifying level 0; its processed scores are returned), level 0 alone (the log of its probabilities, or
        ``None`` for a deterministic drafter), or nobody (no tokens: the verification is a plain decoding step).
        """
        if plan.kind == "plain" or max(budgets, default=0) <= 0:
            return [RowDraft(row.ids[:0]) for row in rows]
        if self.drafters is not None:
            with self.stats.phases.measure("level0"):
                for drafter, row in zip(self.drafters, rows, strict=True):
                    drafter.commit(row.real_ids())
        if plan.kind == "level0":
            return self._level0_drafts(rows, budgets)
        self._prepare_view()
        return self._level1_drafts(rows, budgets)

    def draft_tree(self, shape: TreeShape, row, budget: int) -> TokenTree:
        """One sequence's token tree for level 2, expanded by level 1 depth by depth along ``shape``: at each depth one
        forward over the nodes that get children (a tree mask over the view), whose processed scores give each its
        candidates (greedy: the top ones; sampling: drawn without replacement, the distribution kept for the
        verification). No node deeper than ``budget`` gets children, nor an end of sequence."""
        if self.drafters is not None:
            with self.stats.phases.measure("level0"):
                self.drafters[0].commit(row.real_ids())
        self._prepare_view()
        tree, shape_children = TokenTree.rooted(int(row.ids[-1])), shape.children
        position, forwarded, frontier = int(self.slots.positions[0]), [], [0]
        while frontier:
            internal = [n for n in frontier if self._expands(tree, n, shape_children, budget)]
            if not internal:
                break
            forwarded += internal
            scores = self._tree_step(tree, row, internal, forwarded, position + tree.depths[internal[0]])
            frontier = []
            for node, node_scores_ in zip(internal, scores, strict=True):
                planned = shape_children[tree.shape_nodes[node]]
                tokens, probs = self._candidates(node_scores_, len(planned))
                tree.draft_probs[node] = probs
                frontier += [tree.add(t, node, planned[rank]) for rank, t in enumerate(tokens)]
        return tree

    def _expands(self, tree: TokenTree, node: int, shape_children: list[list[int]], budget: int) -> bool:
        """Whether level 1 draws children for ``node``: the shape gives it some, it is not at the budget's depth, and
        it is the root or not an end of sequence."""
        ended = node > 0 and tree.tokens[node] in self.eos_token_ids
        return bool(shape_children[tree.shape_nodes[node]]) and tree.depths[node] < budget and not ended

    def _tree_step(self, tree: TokenTree, row, internal: list[int], forwarded: list[int], position: int):
        """Level 1's forward over the tree nodes ``internal`` (one depth, at true ``position``), each seeing the
        view and its ancestors among ``forwarded``; their processed scores ``[q, V]``."""
        tokens = torch.tensor([tree.tokens[n] for n in internal], device=row.ids.device)
        start = time.perf_counter()
        with self.stats.phases.measure("level1"):
            logits = self.steps.tree_logits(tokens, position, tree.visibility(internal, forwarded))
        self.planner.observe_tree_step(len(internal), time.perf_counter() - start)
        return node_scores(row.processors, [tree.context(row.ids, n) for n in internal], logits)

    def _candidates(self, scores: torch.Tensor, k: int) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` distinct candidates from processed ``scores`` ``[V]``: the top ones (greedy), or drawn without
        replacement from their softmax, which is returned (sampling); never a token of zero probability."""
        if not self.do_sample:
            k = min(k, int(torch.isfinite(scores).sum()))
            return scores.topk(k).indices.tolist(), None
        probs = scores.float().softmax(-1)
        k = min(k, int((probs > 0).sum()))
        return torch.multinomial(probs, k, replacement=False).tolist(), probs

    def observe_tree(self, tree: TokenTree, path: list[int], ranks: list[int], seconds: float, kept: int) -> None:
        """Record a tree round's verdict: the accepted ``path`` (nodes), the rank taken at each node visited (``-1``:
        none), the verification's ``seconds``; ``kept`` of the path's tokens (the root first) entered the cache, and
        the newest one's query is the next selection's."""
        self._round = (self._round[0], len(path) + 1)
        newest = ([0] + path)[kept - 1]
        self._queries = [self.capture.queries[i][:, :, newest] for i in sorted(self.capture.queries)]
        children = tree.children
        visited = [0] + path
        counts = [len(children[n]) for n in visited if children[n]]
        self.planner.observe_tree(ranks, counts, seconds, tree.size)
        self._record(0, "level1", len(ranks), len(path))
        self.refresh.observe(len(ranks), len(path))
        self.stats.tree_rounds += 1
        self.stats.tree_nodes += tree.size

    def observe_prefill(self) -> None:
        """Keep each row's last prompt query (captured during the prefill) for the first selection."""
        self._queries = self.capture.at(-1)

    def observe_verification(
        self, plan: Plan, drafted: list[int], accepted: list[int], seconds: float, rank: int | None = None
    ) -> None:
        """Record row ``b``'s verdict (``accepted[b]`` of ``drafted[b]``; the forward took ``seconds``) and keep the
        query of its newest cached token (position ``accepted[b]`` of the verification's inputs) for the next
        selection (with step selection, those of every token it accepted: the chunks any of them ranks high are
        nominated). ``rank``: one greedy sequence, the rank of the verifier's token in level 1's scores where it
        rejected (:meth:`~hf_triforce.hierarchy.planner.Planner.observe_level2`)."""
        self._round = (self._round[0], sum(accepted) + len(accepted))
        self._queries = self._accepted_queries(accepted)
        confidences = self._confidences if len(accepted) == 1 else None
        level = {"levels": "level1", "level0": "level0_to_level2"}.get(plan.kind)
        for b, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
            self.planner.observe_level2(plan, d, a, seconds, confidences, rank)
            if level is not None and d:
                self._record(b, level, d, a)
                if plan.kind == "levels":
                    self.refresh.observe(d, a)

    def keep_rows(self, rows: torch.Tensor, kept: list[int]) -> None:
        """Only the rows at ``rows`` remain (``kept``: the same as a list); the view is re-selected next round."""
        self._queries = [q[rows] for q in self._queries]
        if self.drafters is not None:
            self.drafters = [self.drafters[i] for i in kept]
        if self.row_stats is not None:
            self.row_stats = [self.row_stats[i] for i in kept]
        self.steps.forget()

    def _accepted_queries(self, accepted: list[int]) -> list[torch.Tensor]:
        if self.stats.step_selection:  # one row
            return self.capture.upto(accepted[0])
        index = torch.tensor(accepted, device=self.capture.queries[0].device)
        rows = torch.arange(index.shape[0], device=index.device)
        return [self.capture.queries[i][rows, :, index] for i in sorted(self.capture.queries)]

    def _time_round(self) -> None:
        """A round starts: the planner learns how long the last one took, from its start to this one's."""
        now = time.perf_counter()
        if self._round is not None and self._round[1]:
            self.planner.observe_round(self._round[1], now - self._round[0])
        self._round = (now, 0)

    def _record(self, b: int, level: str, drafted: int, accepted: int) -> None:
        """Count row ``b``'s verdict at ``level`` in the call's totals and in the row's own statistics."""
        getattr(self.stats, level).record(drafted, accepted)
        if self.row_stats is not None:
            getattr(self.row_stats[b], level).record(drafted, accepted)

    # -- level 0 -> level 2 ----------------------------------------------------------------------------------

    def _level0_drafts(self, rows: list, budgets: list[int]) -> list[RowDraft]:
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
        if not self.refresh.due(self.steps.tail_length()):
            self.steps.sync()
            return
        start = time.perf_counter()
        with self.stats.phases.measure("refresh"):
            self.steps.select(*self._selection())
        self.planner.observe_refresh(time.perf_counter() - start)
        self.refresh.selected()
        self.stats.retrieval_refreshes += 1
        self.stats.view_bytes = max(self.stats.view_bytes, self.steps.view.kv_nbytes())

    def _selection(self) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Per-layer token indices of the new view, and (with step selection, once the cache holds more than the
        budget: until then the view holds every token) the chunks each level-1 forward re-ranks."""
        cfg = self.config
        settings = (cfg.retrieval_budget, cfg.recent_tokens, cfg.lookahead_chunks)
        if self.stats.step_selection and self.cache.get_seq_length() > cfg.retrieval_budget:
            return nominate(self.cache, self._queries, *settings)
        slots = self.steps.slots  # rows with padding or holes: chunks of those only are never preferred
        return self.cache.select(self._queries, *settings, slots, cfg.rescore_candidates, windows=self.windows), None

    def _level1_drafts(self, rows: list, budgets: list[int]) -> list[RowDraft]:
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
        return [self._trimmed(d, b) for d, b in zip(drafts, budgets, strict=True)]

    def _propose(self, reals, prefixes: list[torch.Tensor], drafts: list[RowDraft], budgets: list[int]):
        """Each row's level-0 drafts for this step, from its real tokens ``reals[b]`` and its level-1 tokens so far:
        ``([k_b] tokens, [k_b, V] probabilities or None)``, no tokens for a row whose budget is met (room for the
        token level 1 adds is kept)."""
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
        """One forward over every row's ``[last token, drafts, padding]``: judge the drafts, extend each row's
        level-1 tokens; returns each row's new tokens ``[n_b]`` and their processed scores ``[n_b, V]``."""
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
        """Whether a row drafts on after level 1 drew ``tokens`` ``[n]`` from processed ``scores`` ``[n, V]``
        (``drafted`` in all): not after an end of sequence; one sequence with confidence stops asks the planner's
        :meth:`~hf_triforce.hierarchy.planner.Planner.keep_drafting` on the estimated chance that every draft so far
        is accepted (keeping level 1's probability of each token, its confidence, for the verdict)."""
        keep = True
        if self.planner.confidence_stops:
            confidences = scores.float().softmax(-1).gather(-1, tokens[:, None])[:, 0].tolist()
            self._confidences += confidences
            self._survival *= math.prod(self.planner.token_acceptance(c) for c in confidences)
            keep = self.planner.keep_drafting(drafted, self._survival)
        return keep and not self.eos_token_ids.intersection(tokens.tolist())

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
