"""One TriForce call over a batch: a left-padded prefill, then rounds in which every row drafts and is verified.

Every row has its own tokens, its own retrieval view (selected from its own queries), its own level-0 drafter and
its own statistics; the forwards are shared. Rows accept different numbers of tokens each round: the full cache
keeps one slot count for all rows, a row that accepted fewer than the widest row leaves holes that are masked from
then on (:mod:`hf_triforce.caches.slots`), so no row loses a token it accepted. A row that stops (EOS, a stop
string, its length limit) stops exactly where plain ``generate()`` stops it and leaves the batch: its slots are
dropped from the caches and it costs no forward afterwards. The output is right-padded with ``pad_token_id``, as
plain batched ``generate()`` pads rows that finished early.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..caches.retrieval import RetrievalCache
from ..caches.slots import CacheSlots, SlotMask
from ..config import TriForceConfig
from ..hf.attention import capturing_queries, slot_attention
from ..hf.generate import eos_token_ids, pad_token_id
from ..hf.model import num_layers
from ..hf.processors import for_row
from ..hf.versions import cache_kwargs
from ..hierarchy.batch_level1 import BatchLevel1, RowDraft, padded_tokens
from ..hierarchy.drafter import Drafter
from ..hierarchy.judge import Drafts, judge_rows
from ..stats import TriForceStats


@dataclass
class BatchRow:
    """One row of a batch: its tokens so far (``[n]``, left padding included), padding, its logits processors (the
    call's, with this row's batch index), state and statistics."""

    index: int
    ids: torch.Tensor
    pad: int
    processors: LogitsProcessorList = field(default_factory=LogitsProcessorList)
    stats: TriForceStats = field(default_factory=TriForceStats)
    done: bool = False


class BatchTriForceRun:
    """State of one batched TriForce ``generate()`` call: the full cache, the rows, level 1 and the verification.

    Args:
        model: the target model.
        input_ids: ``[B, prompt]`` left-padded prompt ids.
        attention_mask: ``[B, prompt]`` the prompts' mask (0 on the left padding).
        logits_processor: the call's processors, applied to each row with that row's tokens.
        stopping_criteria: the call's stopping criteria, applied to each row.
        generation_config: the call's generation config.
        config: the :class:`~hf_triforce.config.TriForceConfig`.
        drafters: one level-0 drafter per row, or ``None``.
        stats: the :class:`~hf_triforce.stats.TriForceStats` to fill (totals, and ``stats.rows``).

    Example:
        >>> cfg = TriForceConfig()
        >>> run = BatchTriForceRun(model, ids, mask, processors, criteria, gen_config, cfg, None)  # doctest: +SKIP
        >>> run.decode()  # [B, prompt + longest row's new tokens]  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        config: TriForceConfig,
        drafters: list[Drafter] | None,
        stats: TriForceStats | None = None,
    ) -> None:
        self.model, self.input_ids, self.config = model, input_ids, config
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.generation_config = generation_config
        self.do_sample = bool(generation_config.do_sample)
        self.stats = stats if stats is not None else TriForceStats()
        mask = attention_mask.bool()
        pads = (~mask).sum(dim=1).tolist()
        self.rows = [
            BatchRow(b, input_ids[b], int(pads[b]), for_row(logits_processor, b)) for b in range(input_ids.shape[0])
        ]
        self.stats.rows = [row.stats for row in self.rows]
        self.active = list(self.rows)
        capacity = config.full_cache_capacity(generation_config.max_length)
        self.cache = RetrievalCache(num_layers(model), config.chunk_size, capacity)
        self.slots = SlotMask(mask)
        self.level1 = BatchLevel1(
            model, self.cache, self.slots, config, self.do_sample, drafters, self.stats,
            [row.stats for row in self.rows], eos_token_ids(generation_config),
        )  # fmt: skip

    def decode(self) -> torch.LongTensor:
        """Run the call; returns ``[B, prompt + new]`` ids, rows that stopped early right-padded with the pad id."""
        start = time.perf_counter()
        with self.stats.phases.measure("prefill"):
            logits = self._prefill_forward()
        self.stats.prefill_seconds = time.perf_counter() - start
        self.level1.observe_prefill()
        rows = [Drafts(row.ids, row.ids[:0], None, logits[b : b + 1]) for b, row in enumerate(self.active)]
        verdicts = judge_rows([row.processors for row in self.active], self.do_sample, rows)
        for row, (_, token, _) in zip(self.active, verdicts, strict=True):
            self._append(row, row.ids.new_tensor([token]))
        self._drop_finished()
        while self.active:
            self._round()
        self.stats.seconds = time.perf_counter() - start
        self.stats.full_cache_bytes = self.cache.kv_nbytes()
        for row in self.rows:
            row.stats.new_tokens = row.ids.shape[0] - self.input_ids.shape[1]
        self.stats.new_tokens = sum(row.stats.new_tokens for row in self.rows)
        return self._sequences()

    def _prefill_forward(self) -> torch.Tensor:
        """The left-padded prompts into the full cache, positions numbered as plain ``generate()`` numbers them;
        last logits ``[B, V]`` (float32)."""
        mask = self.slots.valid
        positions = (mask.long().cumsum(-1) - 1).masked_fill(~mask, 1)
        with capturing_queries(self.model, self.level1.capture, 1) as capture_kwargs:
            out = self.model(
                input_ids=self.input_ids, attention_mask=mask.long(), position_ids=positions, use_cache=True,
                logits_to_keep=1, **cache_kwargs(self.cache), **capture_kwargs,
            )  # fmt: skip
        return out.logits[:, -1].float()

    def _round(self) -> None:
        plan = self.level1.plan_round()
        max_length = self.generation_config.max_length
        budgets = [min(plan.gamma2, max_length - row.ids.shape[0] - 1) for row in self.active]
        drafts = self.level1.draft(plan, self.active, budgets)
        width = max(d.tokens.shape[0] for d in drafts) + 1
        rows = zip(self.active, drafts, strict=True)
        inputs = torch.stack([padded_tokens(torch.cat([r.ids[-1:], d.tokens]), width) for r, d in rows])
        start = time.perf_counter()
        with self.stats.phases.measure("level2"):
            raw = self._forward(inputs)
        seconds = time.perf_counter() - start
        kept, accepted = [], []
        for row, draft, (n, token, _) in zip(self.active, drafts, self._judge(drafts, raw), strict=True):
            appended = self._append(row, torch.cat([draft.tokens[:n], draft.tokens.new_tensor([token])]))
            kept.append(appended)
            accepted.append(n)
            row.stats.target_forwards += 1
            row.stats.decoded_tokens += appended
        self.cache.crop(self.slots.keep(torch.tensor(kept), width))
        self.stats.target_forwards += 1
        self.stats.decoded_tokens += sum(kept)
        self.level1.observe_verification(plan, [d.tokens.shape[0] for d in drafts], accepted, seconds)
        self._drop_finished()

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Full-cache forward over ``inputs`` ``[B, q]`` at each row's next positions; float32 logits ``[B, q, V]``."""
        q = inputs.shape[1]
        positions = self.slots.append(q)
        with (
            capturing_queries(self.model, self.level1.capture, q) as capture_kwargs,
            slot_attention(self.model, CacheSlots(self.slots)) as slot_kwargs,
        ):
            out = self.model(
                input_ids=inputs, position_ids=positions, use_cache=True, logits_to_keep=q,
                **cache_kwargs(self.cache), **capture_kwargs, **slot_kwargs,
            )  # fmt: skip
        return out.logits[:, -q:].float()

    def _judge(self, drafts: list[RowDraft], raw: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
        """Every active row's verdict on its drafts against its ``[q, V]`` share of ``raw`` ``[B, q, V]``."""
        rows = []
        for b, (row, draft) in enumerate(zip(self.active, drafts, strict=True)):
            q = draft.scores.softmax(-1) if self.do_sample and draft.scores is not None else None
            rows.append(Drafts(row.ids, draft.tokens, q, raw[b]))
        return judge_rows([row.processors for row in self.active], self.do_sample, rows)

    def _append(self, row: BatchRow, tokens: torch.Tensor) -> int:
        """Append ``tokens`` to ``row`` one at a time, stopping exactly where plain ``generate()`` would."""
        for i in range(tokens.shape[0]):
            row.ids = torch.cat([row.ids, tokens[i : i + 1]])
            if bool(self.stopping_criteria(row.ids[None], None).any()):
                row.done = True
                return i + 1
        return tokens.shape[0]

    def _drop_finished(self) -> None:
        """Rows that stopped leave the batch: their slots leave the caches, they cost nothing from now on."""
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

    def _sequences(self) -> torch.LongTensor:
        longest = max(row.ids.shape[0] for row in self.rows)
        pad = pad_token_id(self.generation_config)
        out = self.input_ids.new_full((len(self.rows), longest), 0 if pad is None else int(pad))
        for row in self.rows:
            out[row.index, : row.ids.shape[0]] = row.ids
        return out
