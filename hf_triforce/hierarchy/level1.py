"""Level 1 of the hierarchy: the target's weights over a retrieval view draft tokens for the full cache.

Level 1 runs the *target* model over a sparse view of its own KV cache (a ``retrieval_budget``-token
:class:`~hf_triforce.caches.view.RetrievalView`). Each round it produces up to ``gamma2`` tokens: with a level-0
drafter it verifies ``gamma1``-token drafts exactly (token matching, or speculative sampling with residual
resampling), so every level-1 token is distributed exactly as level 1's own ``p_hat``; without one, it decodes
one token per step. It returns those tokens with their processed ``p_hat`` scores, which is the ``q`` that the
full cache (level 2) verifies against.
"""

from __future__ import annotations

import math
import time

import torch
from transformers import LogitsProcessorList

from ..caches.chunk_swap import HOLD, ChunkSwapper, nominate
from ..caches.retrieval import RetrievalCache
from ..caches.selection import EVERY_CHUNK
from ..caches.static_view import StaticRetrievalView
from ..caches.view import RetrievalView
from ..config import TriForceConfig
from ..errors import UnsupportedDeviceError
from ..hf.attention import QueryCapture, view_attention
from ..hf.direct_forward import direct_decoder, resolve_level1_forward
from ..hf.distributed import RankConsensus
from ..hf.linears import int8_linears, int8_weight_copy, resolve_level1_weights
from ..hf.versions import cache_kwargs
from ..stats import TriForceStats
from .drafter import Drafter
from .judge import judge_row
from .model_drafter import ModelDrafter
from .planner import Plan, Planner
from .schedule import RefreshRule
from .static_steps import (
    RunnerSlot,
    StaticStepRunner,
    StepMode,
    keep_runner,
    kept_runner,
    planned_step_mode,
    resolve_step_mode,
)


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
    direct forward (``direct``) or transformers' forward; raises
    :class:`~hf_triforce.errors.UnsupportedDeviceError` where they cannot run (``"int4"`` needs the direct forward).

    Example:
        >>> level1_weights(TriForceConfig(), torch.nn.Linear(16, 4), direct=False)
        'int8'
    """
    weights = resolve_level1_weights(config.level1_weights, model, direct=direct)
    if weights == "int4" and not direct:
        raise UnsupportedDeviceError(
            "TriForceConfig(level1_weights='int4') runs through level 1's direct forward (one sequence, dynamic "
            f"steps), and level 1 runs transformers' forward here (level1_forward={config.level1_forward!r}, "
            f"cuda_graphs={config.cuda_graphs!r}): use level1_weights='int8' or 'auto'."
        )
    return weights


def step_selection(config: TriForceConfig, direct: bool) -> bool:
    """Whether every layer of every level-1 forward re-ranks its view's chunks with its own query
    (``TriForceConfig.step_selection``, see :class:`~hf_triforce.caches.chunk_swap.ChunkSwapper`) when level 1 runs
    its direct forward (``direct``) or transformers'; raises :class:`~hf_triforce.errors.UnsupportedDeviceError` for
    ``True`` without the direct forward (the re-ranking runs inside it, between a layer's query and its attention).

    Example:
        >>> step_selection(TriForceConfig(), direct=True), step_selection(TriForceConfig(step_selection=True), True)
        (False, True)
    """
    if config.step_selection is True and not direct:
        raise UnsupportedDeviceError(
            "TriForceConfig(step_selection=True) ranks the chunks inside level 1's direct forward, per layer (one "
            f"sequence, dynamic steps), and level 1 runs transformers' forward here (level1_forward="
            f"{config.level1_forward!r}, cuda_graphs={config.cuda_graphs!r}): use step_selection=False."
        )
    return config.step_selection


def swaps_without_waiting(model: torch.nn.Module) -> bool:
    """Whether level 1's :class:`ChunkSwapper` re-ranks in fixed shapes, never waiting for the device
    (``sync_free``): on CUDA, where waiting inside a layer stalls the queued forward.

    Example:
        >>> swaps_without_waiting(torch.nn.Linear(2, 2))
        False
    """
    return next(model.parameters()).device.type == "cuda"


class Level1Drafter:
    """Drafts level-1 tokens (with their processed scores) for the full-cache verification.

    Driven by :mod:`hf_triforce.generation`: :meth:`observe_prefill` after the prefill, then per round
    :meth:`draft` before the full-cache verification and :meth:`observe_verification` after it. The full
    cache's verification forwards run inside :func:`~hf_triforce.hf.attention.capturing_queries` with
    :attr:`capture`, which keeps the queries each re-selection scores the chunks with.

    Args:
        model: the target model.
        cache: the target's :class:`~hf_triforce.caches.retrieval.RetrievalCache` (every token but the last of
            the sequence).
        config: the :class:`~hf_triforce.config.TriForceConfig`.
        logits_processor: the ``generate()`` call's processors, used at every level.
        do_sample: sampling (exact speculative sampling) or greedy (token matching).
        drafter: a level-0 :class:`~hf_triforce.hierarchy.drafter.Drafter`, or ``None`` (two levels).
        max_length: the call's ``max_length``; drafts never run past it.
        eos_token_ids: token ids that end generation (drafting stops after one).
        stats: a :class:`~hf_triforce.stats.TriForceStats` to update.
        runner_slot: where a static level-1 runner is kept between calls (the model's state), or ``None``.

    With ``config.cuda_graphs`` resolving to a static mode (see
    :func:`~hf_triforce.hierarchy.static_steps.resolve_step_mode`), level 1 runs over a
    :class:`~hf_triforce.caches.static_view.StaticRetrievalView` through a
    :class:`~hf_triforce.hierarchy.static_steps.StaticStepRunner` (CUDA graphs per width ``1 .. gamma1 + 1``, or
    the same static forward eagerly), and a :class:`~hf_triforce.hierarchy.model_drafter.ModelDrafter` is
    switched to static steps too; the default on the CPU is the dynamic-shape path.

    Example:
        >>> level1 = Level1Drafter(model, cache, TriForceConfig(), LogitsProcessorList(), False)  # doctest: +SKIP
        >>> level1.observe_prefill()  # doctest: +SKIP
        >>> candidates, scores = level1.draft(input_ids)  # [1, cur + g], [1, g, V]  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        cache: RetrievalCache,
        config: TriForceConfig,
        logits_processor: LogitsProcessorList,
        do_sample: bool,
        drafter: Drafter | None = None,
        max_length: int = 2**31,
        eos_token_ids: list[int] | None = None,
        stats: TriForceStats | None = None,
        runner_slot: RunnerSlot | None = None,
    ) -> None:
        self.model, self.cache, self.config = model, cache, config
        self.logits_processor, self.do_sample, self.drafter = logits_processor, do_sample, drafter
        self.max_length = max_length
        self.eos_token_ids = set(eos_token_ids or [])
        self.stats = stats if stats is not None else TriForceStats()
        self.runner_slot = runner_slot
        self.capture = QueryCapture()
        self.view: RetrievalView | StaticRetrievalView | None = None
        consensus = RankConsensus.for_model(model)  # one sequence: its rounds may stop by confidence (not under TP)
        self.planner = Planner(config, has_drafter=drafter is not None, consensus=consensus, one_sequence=True)
        self._confidences: list[float] = []  # level 1's probability of each token of the round's drafts
        self._survival = 1.0  # the estimated chance that all of the round's drafts so far are accepted
        self._round: tuple[float, int] | None = None  # the last round's start and tokens, timed at the next start
        self.plan: Plan | None = None
        self.refresh = RefreshRule(config)
        self._queries: list[torch.Tensor] | None = None
        self._last_drafted = 0
        self.step_mode = resolve_step_mode(config.cuda_graphs, model, "target model")
        self.runner: StaticStepRunner | None = None
        direct = runs_direct_forward(config, model, self.step_mode)
        weights = level1_weights(config, model, direct)
        self.direct = direct_decoder(model, weights) if direct else None
        self.step_selection = step_selection(config, direct)
        self.swapper: ChunkSwapper | None = None
        self._reselect_seconds, self._swapped = 0.0, 0  # the re-rankings of the level-1 forward in progress
        self.stats.step_selection = self.step_selection
        self.int8 = int8_weight_copy(model) if weights == "int8" and self.direct is None else None
        self.stats.level1_weights = weights
        self.stats.level1_forward = "transformers" if self.direct is None else "direct"
        if isinstance(drafter, ModelDrafter):
            draft_mode = resolve_step_mode(config.cuda_graphs, drafter.model, "draft model")
            drafter.use_static_steps(draft_mode, strict=config.cuda_graphs is True)

    def draft(self, input_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """Candidates ``[1, cur + g]`` for the full cache and the scores ``[1, g, V]`` they were drafted from.

        The round's :class:`~hf_triforce.hierarchy.planner.Plan` decides who drafts: level 1 (over the retrieval
        view, verifying level 0; its processed scores are returned), level 0 alone (its probabilities' logs, or
        ``None`` for a deterministic drafter), or nobody (``g = 0``: ``input_ids`` and ``None``, the verification is
        a plain decoding step). ``g <= gamma2`` (``gamma1 + gamma2`` for level 0 alone), and never past
        ``max_length``.
        """
        self._time_round()
        self.plan = self.planner.plan_round()
        budget = min(self.plan.gamma2, self.max_length - input_ids.shape[1] - 1)
        self._last_drafted = 0
        self.stats.rounds[self.plan.kind] = self.stats.rounds.get(self.plan.kind, 0) + 1
        if budget <= 0 or self.plan.kind == "plain":
            return input_ids, None
        if self.drafter is not None:
            with self.stats.phases.measure("level0"):
                self.drafter.commit(input_ids[0])
        if self.plan.kind == "level0":
            tokens, scores = self._level0_draft(input_ids[0], budget)
        else:
            self._prepare_view()
            tokens, scores = self._draft(input_ids[0], budget)
        self._last_drafted = tokens.shape[0]
        return torch.cat([input_ids, tokens[None]], dim=1), None if scores is None else scores[None]

    def observe_verification(self, num_matches: int, seconds: float = 0.0) -> None:
        """Record the verdict of the round's verification (``num_matches`` drafts accepted, the forward took
        ``seconds``) and keep the query of the newest cached token for the next selection (with step selection,
        those of every token it accepted: the chunks any of them ranks high are nominated)."""
        drafted, accepted = self._last_drafted, int(num_matches)
        self._round = (self._round[0], accepted + 1)
        self._queries = self.capture.upto(accepted) if self.step_selection else self.capture.at(accepted)
        self.planner.observe_level2(self.plan, drafted, accepted, seconds, self._confidences)
        if self.plan.kind == "levels":
            self.stats.level1.record(drafted, accepted)
            self.refresh.observe(drafted, accepted)
        elif self.plan.kind == "level0":
            self.stats.level0_to_level2.record(drafted, accepted)

    def _time_round(self) -> None:
        """A round starts: the planner learns how long the last one took, from its start to this one's."""
        now = time.perf_counter()
        if self._round is not None and self._round[1]:
            self.planner.observe_round(self._round[1], now - self._round[0])
        self._round = (now, 0)

    def observe_prefill(self) -> None:
        """Keep the last prompt token's query (captured during the prefill) for the first selection."""
        self._queries = self.capture.at(-1)

    def _prepare_view(self) -> None:
        if not self.refresh.due(None if self.view is None else self.view.tail_length()):
            self.view.sync()
            return
        cfg = self.config
        start = time.perf_counter()
        with self.stats.phases.measure("refresh"):
            if self._ranks_steps():
                indices, nominees = nominate(
                    self.cache, self._queries, cfg.retrieval_budget, cfg.recent_tokens, cfg.lookahead_chunks
                )
            else:
                indices, nominees = self.cache.select(
                    self._queries, cfg.retrieval_budget, cfg.recent_tokens, cfg.lookahead_chunks,
                    rescore_candidates=cfg.rescore_candidates,
                ), None  # fmt: skip
            self.view = self._new_view(indices)
            self.swapper = None if nominees is None else self._swapper(indices, nominees)
        self.planner.observe_refresh(time.perf_counter() - start)
        self.refresh.selected()
        self.stats.retrieval_refreshes += 1
        self.stats.view_bytes = max(self.stats.view_bytes, self.view.kv_nbytes())

    def _ranks_steps(self) -> bool:
        """Whether level-1 forwards re-rank the view's chunks: with step selection, once the cache holds more than
        the budget (until then the view holds every token)."""
        return self.step_selection and self.cache.get_seq_length() > self.config.retrieval_budget

    def _swapper(self, indices: list[torch.Tensor], nominees: list[torch.Tensor]) -> ChunkSwapper:
        """A :class:`ChunkSwapper` for the new view: each step ranks the refresh's nominees by their keys (a chunk's
        mean key loses what one of its tokens holds), and a held chunk stays while it ranks within the top
        ``(1 + HOLD) k`` (fewer copies, the same acceptance); on CUDA without waiting for the device."""
        cfg = self.config
        settings = (cfg.retrieval_budget, cfg.recent_tokens, cfg.lookahead_chunks, EVERY_CHUNK)
        sync_free = swaps_without_waiting(self.model)
        return ChunkSwapper(self.view, indices, *settings, hold=HOLD, nominees=nominees, sync_free=sync_free)

    def _reselect_layer(self, layer: int, query: torch.Tensor) -> None:
        """Inside a level-1 forward, before layer ``layer``'s attention: re-rank its chunks with its own post-RoPE
        queries ``[1, H_q, q, D]`` (all ``q`` of them: a chunk counts if any of them needs it)."""
        start = time.perf_counter()
        self._swapped += self.swapper.reselect_layer(layer, query.reshape(1, -1, query.shape[-1]))
        self._reselect_seconds += time.perf_counter() - start

    def _direct_logits(self, inputs: torch.Tensor, position: int) -> torch.Tensor:
        """Level 1's direct forward; with step selection, each layer re-ranks its chunks first (the ``reselect``
        phase: one call per forward, summed over its layers; on CUDA the time to queue it, the forward waits for
        nothing)."""
        if self.swapper is None:
            return self.direct.logits(inputs, position, self.view)
        self._reselect_seconds, self._swapped = 0.0, 0
        logits = self.direct.logits(inputs, position, self.view, self._reselect_layer)
        self.stats.phases.add("reselect", self._reselect_seconds)
        self.stats.chunks_swapped += int(self._swapped)  # the forward is queued: reading it waits only as the logits do
        return logits

    def _new_view(self, indices: list[torch.Tensor]) -> RetrievalView | StaticRetrievalView:
        """A fresh dynamic view, or the one static view (and its step runner) rewritten in place."""
        if self.step_mode == "dynamic":
            return self.cache.sparse_view(indices, self.config.view_extra_capacity)
        if self.runner is None:
            self.runner = self._level1_runner(self.config.view_capacity)
        self.runner.cache.refresh(indices)
        return self.runner.cache

    def _level1_runner(self, capacity: int) -> StaticStepRunner:
        """The static level-1 runner: the one an earlier call of this model kept (same shapes), else a new one."""
        graphs, strict = self.step_mode == "graphs", self.config.cuda_graphs is True
        key = (capacity, self.config.gamma1, graphs, strict, len(self.cache.layers))
        runner = None if self.runner_slot is None else kept_runner(self.runner_slot, self.model, key)
        if runner is not None:
            runner.cache.rebind(self.cache)
            return runner
        view = StaticRetrievalView(self.cache, capacity)
        runner = StaticStepRunner(self.model, view, range(1, self.config.gamma1 + 2), use_graphs=graphs, strict=strict)
        if self.runner_slot is not None:
            keep_runner(self.runner_slot, self.model, key, runner)
        return runner

    def _draft(self, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``budget`` level-1 tokens and their scores; stops early where the planner's
        :meth:`~hf_triforce.hierarchy.planner.Planner.keep_drafting` says one more token does not pay."""
        tokens, scores = ids[:0], []
        position = self.cache.get_seq_length()
        self._confidences, self._survival = [], 1.0
        while tokens.shape[0] < budget:
            prefix = torch.cat([ids, tokens])
            with self.stats.phases.measure("level0"):
                drafts, draft_probs = self._propose(prefix, budget - tokens.shape[0] - 1)
            start = time.perf_counter()
            with self.stats.phases.measure("level1"):
                new, new_scores = self._level1_step(prefix, drafts, draft_probs, position)
            self.planner.observe_level1(drafts.shape[0], new.shape[0] - 1, time.perf_counter() - start)
            tokens = torch.cat([tokens, new])
            scores.append(new_scores)
            position += new.shape[0]
            keep = self._keep_drafting(new, new_scores, len(tokens))  # first: it records the new tokens' confidence
            if not keep or self.eos_token_ids.intersection(new.tolist()):
                break
        return tokens, torch.cat(scores)

    def _keep_drafting(self, tokens: torch.Tensor, scores: torch.Tensor, drafted: int) -> bool:
        """Whether the round drafts on after level 1 drew ``tokens`` ``[n]`` from processed ``scores`` ``[n, V]``
        (``drafted`` in all): always without confidence stops, else the planner's
        :meth:`~hf_triforce.hierarchy.planner.Planner.keep_drafting` on the estimated chance that every draft so far
        is accepted. Keeps level 1's probability of each token (its confidence) for the verdict."""
        if not self.planner.confidence_stops:
            return True
        confidences = scores.float().softmax(-1).gather(-1, tokens[:, None])[:, 0].tolist()
        self._confidences += confidences
        self._survival *= math.prod(self.planner.token_acceptance(c) for c in confidences)
        return self.planner.keep_drafting(drafted, self._survival)

    def _propose(self, prefix: torch.Tensor, room: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        k = min(self.planner.gamma1(), room)
        if self.drafter is None or k <= 0:
            return prefix[:0], None
        start = time.perf_counter()
        proposal = self.drafter.propose(prefix, k)
        self.planner.observe_level0(k, time.perf_counter() - start)
        return proposal

    def _level0_draft(self, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Level 0's drafts for the full cache directly: tokens ``[g]`` and the log of their distributions ``[g, V]``
        (``None`` for a deterministic drafter: a one-hot ``q``)."""
        with self.stats.phases.measure("level0"):
            tokens, probs = self._propose_for_level2(ids, budget)
        return tokens, None if probs is None else probs.log()

    def _propose_for_level2(self, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        start = time.perf_counter()
        proposal = self.drafter.propose(ids, budget)
        self.planner.observe_level0(budget, time.perf_counter() - start)
        return proposal

    def _level1_step(self, prefix, drafts, draft_probs, position) -> tuple[torch.Tensor, torch.Tensor]:
        """One level-1 forward over ``[last token, drafts]``: verify the drafts, return new tokens + scores."""
        logits = self._level1_logits(torch.cat([prefix[-1:], drafts]), position)
        n_accepted, next_token, scores = judge_row(
            self.logits_processor, self.do_sample, prefix, drafts, draft_probs, logits
        )
        self.view.crop(-(drafts.shape[0] - n_accepted))
        self.stats.level0.record(drafts.shape[0], n_accepted)
        new = torch.cat([drafts[:n_accepted], drafts.new_tensor([next_token])])
        return new, scores[: n_accepted + 1]

    def _level1_logits(self, inputs: torch.Tensor, position: int) -> torch.Tensor:
        """float32 logits ``[q, V]`` of the target over the view for ``inputs`` ``[q]`` at true ``position ..``."""
        if self.runner is not None:
            with int8_linears(self.int8):
                return self.runner.step(inputs, position)
        if self.direct is not None:
            return self._direct_logits(inputs, position)
        q = inputs.shape[0]
        positions = torch.arange(position, position + q, device=inputs.device)[None]
        with view_attention(self.model), int8_linears(self.int8):
            out = self.model(
                input_ids=inputs[None], position_ids=positions, use_cache=True, logits_to_keep=q,
                **cache_kwargs(self.view),
            )  # fmt: skip
        return out.logits[0, -q:].float()
