"""The hierarchical candidate generator: level 0 drafts, level 1 (retrieval view) verifies and drafts."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList
from transformers.generation.candidate_generator import CandidateGenerator

from ..caches.retrieval import RetrievalCache, RetrievalView
from ..caches.static_view import StaticRetrievalView
from ..config import TriForceConfig
from ..integration import QueryCapture, view_attention
from ..sampling import verify_greedy, verify_sampled
from ..stats import TriForceStats
from .graphs import StaticStepRunner, keep_runner, kept_runner, resolve_step_mode
from .model import ModelDrafter

PROBE_EVERY = 8  # level-1 steps between level-0 drafts while level 0 is paused
RATE_SMOOTHING = 0.1  # weight of the newest level-1 step in level 0's running acceptance rate


class TriForceCandidateGenerator(CandidateGenerator):
    """Produces level-1 candidates for the full-cache verification, with their processed logits.

    Level 1 runs the *target* model over a :class:`RetrievalView` (a ``retrieval_budget``-token
    sparse view of the full :class:`RetrievalCache`). With a level-0 drafter it verifies
    ``gamma1``-token drafts exactly (greedy matching or speculative sampling with residual
    resampling), so each level-1 token is distributed exactly as level 1's own distribution
    ``p_hat``; the returned ``candidate_logits`` are those processed ``p_hat`` scores, which is the
    ``q`` the full cache verifies against.

    Follows the transformers ``CandidateGenerator`` contract: ``get_candidates(input_ids)`` returns
    ``(candidate_ids [1, cur + g], candidate_logits [1, g, V] or None)`` and
    ``update_candidate_strategy(input_ids, scores, num_matches)`` is called after every verification.
    ``model_kwargs_overrides`` must be merged into the verification forward (it carries the query
    capture used to re-select chunks).

    Args:
        model: the target model.
        cache: the target's :class:`RetrievalCache` (holding every token but the last of ``input_ids``).
        config: the :class:`TriForceConfig`.
        logits_processor: the ``generate()`` call's processors, used at every level.
        do_sample: sampling (exact speculative sampling) or greedy (token matching).
        drafter: a level-0 drafter (``NGramDrafter``/``ModelDrafter``) or ``None``.
        max_length: the call's ``max_length``; drafts never run past it.
        eos_token_ids: token ids that end generation (drafting stops after one).
        stats: a :class:`TriForceStats` to update.

    With ``config.cuda_graphs`` resolving to a static mode (see
    :func:`~hf_triforce.drafting.graphs.resolve_step_mode`), level 1 runs over a
    :class:`StaticRetrievalView` through a :class:`StaticStepRunner` (CUDA graphs per width
    ``1 .. gamma1 + 1``, or the same static forward eagerly), and a :class:`ModelDrafter` is switched to
    static steps too; the default on the CPU is the dynamic-shape path.
    """

    def __init__(
        self,
        model,
        cache: RetrievalCache,
        config: TriForceConfig,
        logits_processor: LogitsProcessorList,
        do_sample: bool,
        drafter=None,
        max_length: int = 2**31,
        eos_token_ids: list[int] | None = None,
        stats: TriForceStats | None = None,
    ) -> None:
        self.model, self.cache, self.config = model, cache, config
        self.logits_processor, self.do_sample, self.drafter = logits_processor, do_sample, drafter
        self.max_length = max_length
        self.eos_token_ids = set(eos_token_ids or [])
        self.stats = stats if stats is not None else TriForceStats()
        self.capture = QueryCapture()
        self.model_kwargs_overrides = {"triforce_capture": self.capture}
        self.view: RetrievalView | StaticRetrievalView | None = None
        self._queries: list[torch.Tensor] | None = None
        self._force_refresh = False
        self._last_drafted = 0
        self._level0_rate = 1.0
        self._steps_since_draft = 0
        self.step_mode = resolve_step_mode(config.cuda_graphs, model, "target model")
        self.runner: StaticStepRunner | None = None
        if isinstance(drafter, ModelDrafter):
            draft_mode = resolve_step_mode(config.cuda_graphs, drafter.model, "draft model")
            drafter.use_static_steps(draft_mode, strict=config.cuda_graphs is True)

    def get_candidates(self, input_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """Level-1 candidates ``[1, cur + g]`` and their processed level-1 scores ``[1, g, V]``."""
        budget = min(self.config.gamma2, self.max_length - input_ids.shape[1] - 1)
        self._last_drafted = 0
        if budget <= 0:
            return input_ids, None
        self._prepare_view()
        tokens, scores = self._draft(input_ids[0], budget)
        self._last_drafted = tokens.shape[0]
        return torch.cat([input_ids, tokens[None]], dim=1), scores[None]

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches: int):
        """Record level-1 acceptance and keep the query of the newest cached token for the next selection."""
        self._queries = self.capture.at(int(num_matches))
        self.stats.retrieval.record(self._last_drafted, int(num_matches))
        threshold = self.config.refresh_below_acceptance
        if threshold is not None and self._last_drafted and num_matches / self._last_drafted < threshold:
            self._force_refresh = True

    def observe_prefill(self) -> None:
        """Keep the last prompt token's query (captured during the prefill) for the first selection."""
        self._queries = self.capture.at(-1)

    def _prepare_view(self) -> None:
        stale = self.view is None or self.view.tail_length() >= self.config.refresh_every
        if stale or self._force_refresh:
            cfg = self.config
            with self.stats.phases.measure("refresh"):
                indices = self.cache.select(self._queries, cfg.retrieval_budget, cfg.recent_window)
                self.view = self._new_view(indices, cfg.refresh_every + cfg.gamma2 + cfg.gamma1 + 2)
            self.stats.retrieval_refreshes += 1
            self.stats.view_bytes = max(self.stats.view_bytes, self.view.kv_nbytes())
            self._force_refresh = False
        else:
            self.view.sync()

    def _new_view(self, indices: list[torch.Tensor], extra: int) -> RetrievalView | StaticRetrievalView:
        """A fresh dynamic view, or the one static view (and its step runner) rewritten in place."""
        if self.step_mode == "dynamic":
            return self.cache.sparse_view(indices, extra)
        if self.runner is None:
            self.runner = self._level1_runner(self.config.retrieval_budget + extra)
        self.runner.cache.refresh(indices)
        return self.runner.cache

    def _level1_runner(self, capacity: int) -> StaticStepRunner:
        """The static level-1 runner: the one an earlier call of this model kept (same shapes), else a new one."""
        graphs, strict = self.step_mode == "graphs", self.config.cuda_graphs is True
        key = (capacity, self.config.gamma1, graphs, strict, len(self.cache.layers))
        runner = kept_runner(self.model, key)
        if runner is not None:
            runner.cache.rebind(self.cache)
            return runner
        view = StaticRetrievalView(self.cache, capacity)
        runner = StaticStepRunner(self.model, view, range(1, self.config.gamma1 + 2), use_graphs=graphs, strict=strict)
        keep_runner(self.model, key, runner)
        return runner

    def _draft(self, ids: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, scores = ids[:0], []
        position = self.cache.get_seq_length()
        while tokens.shape[0] < budget:
            prefix = torch.cat([ids, tokens])
            with self.stats.phases.measure("draft"):
                drafts, draft_probs = self._propose(prefix, budget - tokens.shape[0] - 1)
            with self.stats.phases.measure("level1"):
                new, new_scores = self._level1_step(prefix, drafts, draft_probs, position)
            tokens = torch.cat([tokens, new])
            scores.append(new_scores)
            position += new.shape[0]
            if self.eos_token_ids.intersection(new.tolist()):
                break
        return tokens, torch.cat(scores)

    def _propose(self, prefix: torch.Tensor, room: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        k = min(self.config.gamma1, room)
        if self.drafter is None or k <= 0 or not self._level0_worthwhile():
            return prefix[:0], None
        return self.drafter.propose(prefix, k)

    def _level0_worthwhile(self) -> bool:
        """Draft unless level 0's running acceptance is under ``draft_acceptance_floor`` (probe every 8 steps)."""
        self._steps_since_draft += 1
        if self._level0_rate >= self.config.draft_acceptance_floor or self._steps_since_draft >= PROBE_EVERY:
            self._steps_since_draft = 0
            return True
        return False

    def _record_level0(self, drafted: int, accepted: int) -> None:
        if drafted:
            self._level0_rate += RATE_SMOOTHING * (accepted / drafted - self._level0_rate)

    def _level1_step(self, prefix, drafts, draft_probs, position) -> tuple[torch.Tensor, torch.Tensor]:
        """One level-1 forward over ``[last token, drafts]``: verify the drafts, return new tokens + scores."""
        inputs = torch.cat([prefix[-1:], drafts])
        scores = self._scores(inputs, prefix, position)
        if self.do_sample:
            n_accepted, next_token = verify_sampled(drafts, draft_probs, scores.softmax(dim=-1))
        else:
            n_accepted, next_token = verify_greedy(drafts, scores)
        self.view.crop(-(drafts.shape[0] - n_accepted))
        self.stats.draft.record(drafts.shape[0], n_accepted)
        self._record_level0(drafts.shape[0], n_accepted)
        new = torch.cat([drafts[:n_accepted], drafts.new_tensor([next_token])])
        return new, scores[: n_accepted + 1]

    def _scores(self, inputs: torch.Tensor, prefix: torch.Tensor, position: int) -> torch.Tensor:
        q = inputs.shape[0]
        logits = self._level1_logits(inputs, position)
        context = torch.cat([prefix, inputs[1:]])
        n = prefix.shape[0]
        rows = [self.logits_processor(context[None, : n + i], logits[i : i + 1])[0] for i in range(q)]
        return torch.stack(rows)

    def _level1_logits(self, inputs: torch.Tensor, position: int) -> torch.Tensor:
        """float32 logits ``[q, V]`` of the target over the view for ``inputs`` ``[q]`` at true ``position ..``."""
        if self.runner is not None:
            return self.runner.step(inputs, position)
        q = inputs.shape[0]
        positions = torch.arange(position, position + q, device=inputs.device)[None]
        with view_attention(self.model):
            out = self.model(
                input_ids=inputs[None], position_ids=positions, past_key_values=self.view, use_cache=True,
                logits_to_keep=q,
            )  # fmt: skip
        return out.logits[0, -q:].float()
