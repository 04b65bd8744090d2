"""One TriForce call's decoding loop: the prefill, then rounds of level-1 drafting and full-cache verification.

A single sequence is a batch of one; each row has its own tokens, view, drafter and statistics, the forwards are
shared. A row that accepts fewer tokens than the widest leaves holes, masked from then on
(:mod:`hf_triforce.caches.slots`); a row that stops leaves the batch and its caches.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..caches.retrieval import RetrievalCache
from ..caches.slots import CacheSlots, SlotMask
from ..config import TriForceConfig
from ..hf.attention import QueryCapture, capturing_queries, slot_attention, tree_attention
from ..hf.generate import eos_token_ids, pad_token_id
from ..hf.processors import for_row
from ..hf.progress import prefill_progress, show_progress
from ..hf.versions import cache_kwargs
from ..hierarchy import Drafter, Level1Drafter, ModelDrafter, Row, RowDraft, padded_tokens
from ..hierarchy.calibration import TIMES, CallCosts, level2_widths, timed, tree_verification_widths
from ..hierarchy.judge import Drafts, judge_rows, node_scores
from ..hierarchy.planner import Plan
from ..hierarchy.static_steps import RunnerSlot
from ..sampling import verify_tree
from ..stats import TriForceStats
from .plan import CallPlan


class TriForceRun:
    """State of one TriForce ``generate()`` call: the full cache, the rows, level 1 and level 2 (the verification).

    Each round level 2 verifies every row's drafts in one full-cache forward, appends the accepted tokens one at a
    time (so the stopping criteria stop exactly where plain ``generate()`` does) and crops what no row kept.

    Args:
        input_ids: ``[B, prompt]`` prompt ids, left-padded.
        attention_mask: ``[B, prompt]`` (0 on the left padding), or ``None`` (no padding).
        cache: the full cache, already holding the first ``reused`` tokens of every row.
        drafters: one level-0 drafter per row, or ``None`` (two levels).
        runner_slot: where a static level-1 runner is kept between calls, or ``None``.
        costs: the step costs the planner decides with (:func:`~hf_triforce.hierarchy.calibration.step_costs`).

    Example:
        >>> cache = RetrievalCache(num_layers=30, chunk_size=8)  # doctest: +SKIP
        >>> cfg = TriForceConfig()
        >>> run = TriForceRun(model, ids, None, processors, criteria, gen_config, cfg, plan, cache)  # doctest: +SKIP
        >>> sequences = run.decode(streamer=None)  # [B, prompt + new]  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        config: TriForceConfig,
        plan: CallPlan,
        cache: RetrievalCache,
        reused: int = 0,
        stats: TriForceStats | None = None,
        drafters: list[Drafter] | None = None,
        runner_slot: RunnerSlot | None = None,
        costs: CallCosts | None = None,
    ) -> None:
        self.model, self.input_ids, self.config, self.plan = model, input_ids, config, plan
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.generation_config, self.do_sample = generation_config, bool(generation_config.do_sample)
        self.cache, self.reused, self.batched, self.drafters = cache, reused, plan.batched, drafters
        self.stats = stats if stats is not None else TriForceStats()
        self.stats.reused_tokens = reused
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.rows = [self._row(b, input_ids[b], mask[b], logits_processor) for b in range(input_ids.shape[0])]
        self.stats.rows = [row.stats for row in self.rows] if self.batched else []
        for row in self.stats.rows:
            row.level1_weights, row.level1_forward = plan.level1_weights, plan.level1_forward
        self.active = list(self.rows)
        self.slots = SlotMask(mask)
        gc = generation_config
        self.scores = () if gc.return_dict_in_generate and gc.output_scores else None
        self.raw_logits = () if gc.return_dict_in_generate and gc.output_logits else None
        self.capture = QueryCapture()  # each full-cache forward's queries, for level 1's selections
        self.level1 = Level1Drafter(
            model, cache, self.slots, config, plan, self.do_sample, drafters, self.stats, self.stats.rows or None,
            eos_token_ids(gc), runner_slot=runner_slot, costs=costs,
        )  # fmt: skip

    def _row(self, b: int, ids: torch.Tensor, mask: torch.Tensor, logits_processor: LogitsProcessorList) -> Row:
        if not self.batched:
            return Row(b, ids, processors=logits_processor)
        real = None if bool(mask.all()) else ids[mask]
        return Row(b, ids, real, for_row(logits_processor, b), prompt_length=ids.shape[0])

    def decode(self, streamer=None) -> torch.LongTensor:
        """Run the call; returns ``[B, prompt + new]`` ids, rows that stopped early right-padded with the pad id."""
        start = time.perf_counter()
        self.stats.phases.synchronize = True  # once, after the prefill (the rounds synchronize only to measure costs)
        with self.stats.phases.measure("prefill"):
            logits = self._prefill_forward()
        self.level1.observe_prefill(self.capture)
        self._first_tokens(logits, streamer)
        self.stats.prefill_seconds = time.perf_counter() - start
        self._drop_finished()
        self.cache.record_rounds(True)  # sliding layers keep a round's tokens until its verification's crop
        try:
            if self.active and self.level1.planner.timing:
                self._calibrate()
            while self.active:
                self._round(streamer)
                self._drop_finished()
        finally:
            self.cache.record_rounds(False)
        if streamer is not None:
            streamer.end()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # once, after the rounds: the call's time is the device's
        self.stats.seconds = time.perf_counter() - start
        self._final_stats()
        return self._sequences()

    # -- the prefill -----------------------------------------------------------------------------------------

    def _prefill_forward(self) -> torch.Tensor:
        """Forward(s) of the uncached prompt into the full cache; the last position's float32 logits ``[B, V]``."""
        length = self.input_ids.shape[1] - self.reused
        step = self.config.prefill_chunk_size or length
        starts = range(self.reused, self.input_ids.shape[1], step)
        if len(starts) == 1:
            with prefill_progress(self.model, length):
                return self._prefill_chunk(self.reused, self.input_ids.shape[1])
        bar = tqdm(starts, desc="TriForce prefill", unit="chunk", leave=False, disable=not show_progress(length))
        for first in bar:
            logits = self._prefill_chunk(first, min(first + step, self.input_ids.shape[1]))
        return logits

    def _prefill_chunk(self, first: int, end: int) -> torch.Tensor:
        """Prompt tokens ``first .. end`` into the full cache (positions as ``generate()`` numbers a padded row)."""
        masking = {}
        if self.batched:
            valid = self.slots.valid[:, :end]
            positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)[:, first:]
            masking["attention_mask"] = valid.long()
        else:
            positions = torch.arange(first, end, device=self.input_ids.device)[None]
        with capturing_queries(self.model, self.capture, 1):
            out = self.model(
                input_ids=self.input_ids[:, first:end], position_ids=positions, use_cache=True, logits_to_keep=1,
                **cache_kwargs(self.cache), **masking,
            )  # fmt: skip
        return out.logits[:, -1].float()

    def _first_tokens(self, raw: torch.Tensor, streamer) -> None:
        """Every row's first new token from the prefill's logits ``[B, V]``, as plain ``generate()`` chooses it."""
        scores = self.logits_processor(self.input_ids, raw.clone())
        tokens = torch.multinomial(scores.softmax(-1), 1)[:, 0] if self.do_sample else scores.argmax(-1)
        for b, row in enumerate(self.active):
            self._append(row, tokens[b : b + 1], scores[b : b + 1], raw[b : b + 1], streamer)

    # -- the planner's costs ---------------------------------------------------------------------------------

    def _calibrate(self) -> None:
        """Time this kind of call's steps once (the first call of its kind on this model and device): full-cache
        forwards of :func:`~hf_triforce.hierarchy.calibration.level2_widths` (and the trees' widths where width is
        cheap) whose tokens are cropped again, then level 1's and level 0's (:meth:`Level1Drafter.calibrate`). The
        random state is restored after, so the call's text is what it would be without them."""
        planner, device, config = self.level1.planner, self.input_ids.device, self.config
        room = self._free_slots()
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with self.stats.phases.measure("calibration"):
                for width in level2_widths(config, self.drafters is not None):
                    self._time_verification(min(width, room))
                trees = planner.trees and config.tree_budget == "auto"
                for width in tree_verification_widths(planner.costs) if trees else []:
                    if width <= room:  # the reserved storage holds it (a wider one is priced by the fit)
                        self._time_verification(width)
                self.level1.calibrate(self.active)
        planner.costs.fix()

    def _free_slots(self) -> int:
        """Slots of the full cache's reservation (:meth:`TriForceConfig.full_cache_capacity`) not yet holding a token:
        the widest forward that fits without growing it."""
        return self.config.full_cache_capacity(self.generation_config.max_length) - self.cache.get_seq_length()

    def _time_verification(self, width: int) -> None:
        """Time a ``width``-token full-cache forward of every row (:data:`TIMES` times) into the planner's costs; its
        tokens leave the cache and the slots again."""
        rows, capture = len(self.active), self.capture
        inputs = torch.stack([row.ids[-1:].repeat(width) for row in self.active])
        self.capture = QueryCapture()  # the prefill's queries select the first view
        try:
            for _ in range(TIMES):
                positions = self.slots.append(width)
                seconds = timed(functools.partial(self._verify, inputs, positions), inputs.device)
                self.cache.crop(self.slots.keep(torch.zeros(rows, dtype=torch.long), width))
                self.cache.trim(self.slots if self.batched else None)
                self.level1.planner.costs.level2.observe(width, seconds)
        finally:
            self.capture = capture

    # -- a round ---------------------------------------------------------------------------------------------

    def _round(self, streamer) -> None:
        max_length = self.generation_config.max_length
        plan = self.level1.plan_round(self._free_slots())
        if plan.tree is not None and max_length - self.active[0].ids.shape[0] - 1 > 0:
            return self._tree_round(plan, min(plan.tree.depth, max_length - self.active[0].ids.shape[0] - 1), streamer)
        budgets = [min(plan.gamma2, max_length - row.ids.shape[0] - 1) for row in self.active]
        drafts = self.level1.draft(plan, self.active, budgets)
        width = max(d.tokens.shape[0] for d in drafts) + 1
        rows = zip(self.active, drafts, strict=True)
        inputs = torch.stack([padded_tokens(torch.cat([r.ids[-1:], d.tokens]), width) for r, d in rows])
        start = time.perf_counter()
        with self.stats.phases.measure("level2"):
            raw = self._verify(inputs, self.slots.append(width))
        seconds = time.perf_counter() - start
        kept = []
        verdicts = self._judge(drafts, raw)
        for b, (row, draft, (n, token, scores)) in enumerate(zip(self.active, drafts, verdicts, strict=True)):
            tokens = torch.cat([draft.tokens[:n], draft.tokens.new_tensor([token])])
            kept.append(self._append(row, tokens, scores[: n + 1], raw[b, : n + 1], streamer))
            row.stats.target_forwards += 1
            row.stats.decoded_tokens += kept[-1]
        self.cache.crop(self.slots.keep(torch.tensor(kept), width))
        self.cache.trim(self.slots if self.batched else None)  # sliding layers: back to what the next query sees
        self.stats.target_forwards += 1
        self.stats.decoded_tokens += sum(kept)
        rank = self._missed_rank(plan, drafts, verdicts)
        drafted, accepted = [d.tokens.shape[0] for d in drafts], [n for n, _, _ in verdicts]
        self.level1.observe_verification(plan, drafted, accepted, seconds, self.capture, budgets, rank)

    def _missed_rank(self, plan: Plan, drafts: list[RowDraft], verdicts) -> int | None:
        """Rank of level 2's token in level 1's scores at the first rejection (0: none) of a greedy sequence's
        level-1 round, for token trees; ``None`` for other rounds."""
        if self.batched or self.do_sample or plan.kind != "levels" or drafts[0].scores is None:
            return None
        n, token, _ = verdicts[0]
        if n >= drafts[0].tokens.shape[0]:
            return 0  # still a trial for every rank (p_k is unconditional)
        scores = drafts[0].scores[n]
        return int((scores > scores[token]).sum())

    # -- a token-tree round (one sequence) -------------------------------------------------------------------

    def _tree_round(self, plan: Plan, budget: int, streamer) -> None:
        """Draft the plan's token tree (depth at most ``budget``), verify it in one forward, keep the accepted path."""
        row = self.active[0]
        tree = self.level1.draft_tree(plan.tree, row, budget)
        start = time.perf_counter()
        with self.stats.phases.measure("level2"):
            positions = (self.slots.positions[0] + torch.tensor(tree.depths, device=self.input_ids.device))[None]
            self.slots.append(tree.size)
            visibility = tree.visibility(list(range(tree.size)), list(range(tree.size)))
            raw = self._verify(tree.token_tensor(self.input_ids.device)[None], positions, visibility)[0]
        seconds = time.perf_counter() - start
        scores = node_scores(row.processors, [tree.context(row.ids, n) for n in range(tree.size)], raw)
        tokens = tree.token_tensor(raw.device)
        if self.do_sample:
            draft = tree.draft_matrix(raw.shape[-1], raw.device)
            path, token, ranks = verify_tree(tokens, tree.children, scores.softmax(-1), draft)
        else:
            path, token, ranks = verify_tree(tokens, tree.children, scores)
        nodes, new = [0, *path], torch.cat([tokens[path], tokens.new_tensor([token])])
        kept = self._append(row, new, scores[nodes], raw[nodes], streamer)
        self.cache.keep_path(self.cache.get_seq_length() - tree.size, torch.tensor(nodes[:kept]))
        self.cache.trim()
        self.slots.keep(torch.tensor([kept]), tree.size)
        for stats in (row.stats, self.stats):
            stats.target_forwards += 1
            stats.decoded_tokens += kept
        self.level1.observe_tree(tree, path, ranks, seconds, kept, self.capture)

    def _verify(
        self, inputs: torch.Tensor, positions: torch.Tensor, visibility: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Full-cache forward of ``inputs`` ``[B, q]`` at ``positions`` ``[B, q]`` (a tree: with ``visibility``
        ``[q, q]``); float32 logits ``[B, q, V]``, queries in :attr:`capture`."""
        q = inputs.shape[1]
        with contextlib.ExitStack() as stack:
            stack.enter_context(capturing_queries(self.model, self.capture, q))
            if visibility is not None:  # a token tree: each node sees the cache and its ancestors
                stack.enter_context(tree_attention(self.model, visibility.to(inputs.device)))
            if self.batched:  # padding and holes: each row attends to its own real slots
                stack.enter_context(slot_attention(self.model, CacheSlots(self.slots, self.cache)))
            out = self.model(
                input_ids=inputs, position_ids=positions, use_cache=True, logits_to_keep=q, **cache_kwargs(self.cache)
            )
        return out.logits[:, -q:].float()

    def _judge(self, drafts: list[RowDraft], raw: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
        """Every active row's verdict on its drafts against its ``[q, V]`` share of ``raw`` ``[B, q, V]``."""
        rows = []
        for b, (row, draft) in enumerate(zip(self.active, drafts, strict=True)):
            q = draft.scores.softmax(-1) if self.do_sample and draft.scores is not None else None
            rows.append(Drafts(row.ids, draft.tokens, q, raw[b]))
        return judge_rows([row.processors for row in self.active], self.do_sample, rows)

    def _append(self, row: Row, tokens: torch.Tensor, scores: torch.Tensor, raw: torch.Tensor, streamer) -> int:
        """Append ``tokens`` ``[n]`` to ``row`` one at a time, stopping where plain ``generate()`` would; how many."""
        appended = tokens.shape[0]
        for i in range(tokens.shape[0]):
            row.ids = torch.cat([row.ids, tokens[i : i + 1]])
            if self.scores is not None:
                self.scores += (scores[i : i + 1],)
            if self.raw_logits is not None:
                self.raw_logits += (raw[i : i + 1],)
            if bool(self.stopping_criteria(row.ids[None], self.scores).any()):
                row.done, appended = True, i + 1
                break
        if streamer is not None:
            streamer.put(tokens[:appended].cpu())
        return appended

    def _drop_finished(self) -> None:
        """Rows that stopped leave the batch and the caches."""
        kept = [i for i, row in enumerate(self.active) if not row.done]
        if len(kept) == len(self.active):
            return
        self.active = [self.active[i] for i in kept]
        if not kept:
            return
        rows = torch.tensor(kept, device=self.slots.valid.device)
        self.cache.keep_rows(rows)
        self.slots.keep_rows(rows)
        self.level1.keep_rows(rows, kept)

    # -- the end ---------------------------------------------------------------------------------------------

    def _final_stats(self) -> None:
        self.stats.full_cache_bytes = self.cache.kv_nbytes()
        if not self.batched:
            self.stats.positional_acceptance = self.level1.planner.positional.to_dict()
        self.stats.planner = self.level1.planner.explain(context_tokens=self.slots.length)
        if self.cache.transfers is not None:
            self.stats.kv_bytes_to_device = self.cache.transfers.to_device
            self.stats.kv_bytes_to_host = self.cache.transfers.to_host
        models = [d for d in self.drafters or () if isinstance(d, ModelDrafter)]
        self.stats.draft_cache_bytes = sum(d.cache.kv_nbytes() for d in models)
        for row in self.rows:
            row.stats.new_tokens = row.ids.shape[0] - self.input_ids.shape[1]
        self.stats.new_tokens = sum(row.stats.new_tokens for row in self.rows)

    def _sequences(self) -> torch.LongTensor:
        longest = max(row.ids.shape[0] for row in self.rows)
        pad = pad_token_id(self.generation_config)
        out = self.input_ids.new_full((len(self.rows), longest), 0 if pad is None else int(pad))
        for row in self.rows:
            out[row.index, : row.ids.shape[0]] = row.ids
        return out
