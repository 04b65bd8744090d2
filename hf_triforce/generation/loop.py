"""One TriForce call's decoding loop: the prefill, then rounds of level-1 drafting and full-cache verification."""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..caches.retrieval import RetrievalCache
from ..caches.streaming import StreamingLLMCache
from ..config import TriForceConfig
from ..hf.attention import capturing_queries
from ..hf.progress import prefill_progress, show_progress
from ..hf.versions import cache_kwargs
from ..hierarchy import Level1Drafter
from ..hierarchy.judge import judge_row
from ..stats import TriForceStats


class TriForceRun:
    """State of one TriForce ``generate()`` call: the full cache, the sequence, and level 2 (the verification).

    Level 2 is the target with its full :class:`~hf_triforce.caches.retrieval.RetrievalCache`: each round it
    verifies the ``level1`` drafter's tokens in one forward with the call's logits processors (token matching,
    or exact speculative sampling against level 1's scores), appends the accepted tokens one at a time so the
    call's stopping criteria stop it exactly where plain ``generate()`` stops, and crops the rejected ones.

    Args:
        model: the target model.
        input_ids: ``[1, prompt]`` prompt ids.
        logits_processor: the call's processors.
        stopping_criteria: the call's stopping criteria.
        generation_config: the call's generation config.
        config: the :class:`~hf_triforce.config.TriForceConfig`.
        cache: the full cache, holding the first ``reused`` tokens of ``input_ids`` already.
        reused: tokens of ``input_ids`` already in ``cache`` (a caller's prefix, see
            :mod:`~hf_triforce.generation.reuse`); only the rest is prefilled.
        stats: the :class:`~hf_triforce.stats.TriForceStats` to fill (a new one by default).

    Example:
        >>> cache = RetrievalCache(num_layers=30, chunk_size=8)  # doctest: +SKIP
        >>> run = TriForceRun(model, ids, processors, criteria, gen_config, TriForceConfig(), cache)  # doctest: +SKIP
        >>> run.level1 = Level1Drafter(model, run.cache, run.config, processors, False)  # doctest: +SKIP
        >>> sequences = run.decode(streamer=None)  # [1, prompt + new]  # doctest: +SKIP
    """

    def __init__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor: LogitsProcessorList,
        stopping_criteria: StoppingCriteriaList,
        generation_config: GenerationConfig,
        config: TriForceConfig,
        cache: RetrievalCache,
        reused: int = 0,
        stats: TriForceStats | None = None,
    ) -> None:
        self.model, self.input_ids = model, input_ids
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.generation_config, self.config = generation_config, config
        self.do_sample = bool(generation_config.do_sample)
        self.cache, self.reused = cache, reused
        self.stats = stats if stats is not None else TriForceStats()
        self.stats.reused_tokens = reused
        gc = generation_config
        self.scores = () if gc.return_dict_in_generate and gc.output_scores else None
        self.raw_logits = () if gc.return_dict_in_generate and gc.output_logits else None
        self.level1: Level1Drafter | None = None
        self.draft_cache: StreamingLLMCache | None = None
        self.done = False

    def decode(self, streamer) -> torch.LongTensor:
        start = time.perf_counter()
        prompt_length = self.input_ids.shape[1]
        self._prefill(streamer)
        self.stats.prefill_seconds = time.perf_counter() - start
        while not self.done:
            self._round(streamer)
        if streamer is not None:
            streamer.end()
        self.stats.seconds = time.perf_counter() - start
        self.stats.full_cache_bytes = self.cache.kv_nbytes()
        if self.draft_cache is not None:
            self.stats.draft_cache_bytes = self.draft_cache.kv_nbytes()
        self.stats.new_tokens = self.input_ids.shape[1] - prompt_length
        return self.input_ids

    def _forward(self, tokens: torch.Tensor, keep: int):
        """Full-cache forward over ``tokens`` ``[1, q]``; returns float32 logits ``[1, keep, V]``."""
        start = self.cache.get_seq_length()
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
        with capturing_queries(self.model, self.level1.capture, keep) as capture_kwargs:
            out = self.model(
                input_ids=tokens,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=keep,
                **cache_kwargs(self.cache),
                **capture_kwargs,
            )
        return out.logits[:, -keep:].float()

    def _prefill(self, streamer) -> None:
        with self.stats.phases.measure("prefill"):
            logits = self._prefill_forward()
        self.level1.observe_prefill()
        raw = logits[:, -1]
        scores = self.logits_processor(self.input_ids, raw.clone())
        token = torch.multinomial(scores.softmax(-1), 1)[0] if self.do_sample else scores.argmax(-1)
        self._append(token, scores[None], raw[None], streamer)

    def _prefill_forward(self) -> torch.Tensor:
        """Forward(s) of the uncached prompt tokens into the full cache (a progress bar for long ones); last logits
        ``[1, 1, V]``."""
        new = self.input_ids[:, self.reused :]
        step = self.config.prefill_chunk_size or new.shape[1]
        starts = range(0, new.shape[1], step)
        if len(starts) == 1:
            with prefill_progress(self.model, new.shape[1]):
                return self._forward(new, keep=1)
        for start in tqdm(
            starts, desc="TriForce prefill", unit="chunk", leave=False, disable=not show_progress(new.shape[1])
        ):
            logits = self._forward(new[:, start : start + step], keep=1)
        return logits

    def _round(self, streamer) -> None:
        cur = self.input_ids.shape[1]
        candidates, candidate_scores = self.level1.draft(self.input_ids)
        drafts = candidates[0, cur:]
        g = drafts.shape[0]
        start = time.perf_counter()
        with self.stats.phases.measure("level2"):
            raw = self._forward(candidates[:, cur - 1 :], keep=g + 1)
        seconds = time.perf_counter() - start
        q = candidate_scores[0].softmax(-1) if self.do_sample and candidate_scores is not None else None
        n_matches, next_token, row_scores = judge_row(
            self.logits_processor, self.do_sample, self.input_ids[0], drafts, q, raw[0]
        )
        scores = row_scores[None]
        valid = torch.cat([drafts[:n_matches], drafts.new_tensor([next_token])])
        appended = self._append(valid, scores[:, : n_matches + 1], raw[:, : n_matches + 1], streamer)
        self.cache.crop(-(g + 1 - appended))
        self.stats.target_forwards += 1
        self.stats.decoded_tokens += appended
        self.level1.observe_verification(n_matches, seconds)

    def _append(self, tokens: torch.Tensor, scores: torch.Tensor, raw: torch.Tensor, streamer) -> int:
        """Append tokens one at a time, stopping exactly where plain ``generate()`` would; returns the count."""
        appended = 0
        for i in range(tokens.shape[0]):
            self.input_ids = torch.cat([self.input_ids, tokens[None, i : i + 1]], dim=1)
            appended += 1
            if self.scores is not None:
                self.scores += (scores[:, i],)
            if self.raw_logits is not None:
                self.raw_logits += (raw[:, i],)
            if bool(self.stopping_criteria(self.input_ids, self.scores).any()):
                self.done = True
                break
        if streamer is not None:
            streamer.put(tokens[:appended].cpu())
        return appended
