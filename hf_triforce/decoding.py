"""The TriForce decoding loop, run by ``generate(custom_generate=...)``, and its input validation."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .caches.retrieval import RetrievalCache
from .caches.streaming import StreamingLLMCache
from .config import TriForceConfig
from .drafting import ModelDrafter, NGramDrafter, TriForceCandidateGenerator
from .errors import TriForceConfigError, UnsupportedGenerationError, UnsupportedModelError
from .integration import (
    capturing_queries,
    check_model_supported,
    prefill_progress,
    rotary_inv_freq,
    show_progress,
    small_batch_linears,
    vocab_size,
)
from .sampling import verify_greedy, verify_sampled
from .stats import TriForceStats

logger = logging.getLogger(__name__)


def prepare_triforce_call(model, triforce_config: TriForceConfig | dict, generate_kwargs: dict[str, Any]):
    """Validate what can be checked from the call's kwargs and build the ``custom_generate`` callable.

    Pops ``assistant_model`` from ``generate_kwargs`` (TriForce runs the draft model itself).
    """
    config = _as_config(triforce_config)
    assistant = generate_kwargs.pop("assistant_model", None)
    drafter = _resolve_drafter(config, assistant)
    if assistant is not None and drafter == "model":
        _check_assistant(model, assistant)
    return functools.partial(
        triforce_decode,
        triforce_config=config,
        assistant_model=assistant if drafter == "model" else None,
        drafter_kind=drafter,
        triforce_streamer=generate_kwargs.get("streamer"),
    )


def _as_config(config) -> TriForceConfig:
    if isinstance(config, TriForceConfig):
        return config
    if isinstance(config, dict):
        return TriForceConfig.from_dict(config)
    raise TriForceConfigError(f"triforce_config must be a TriForceConfig or a dict, got {type(config).__name__}.")


def _resolve_drafter(config: TriForceConfig, assistant) -> str:
    if config.drafter == "auto":
        return "model" if assistant is not None else "ngram"
    if config.drafter == "model" and assistant is None:
        raise TriForceConfigError(
            "drafter='model' needs a draft model: pass assistant_model=<small model> to generate()."
        )
    if config.drafter != "model" and assistant is not None:
        logger.warning("assistant_model is ignored with drafter=%r.", config.drafter)
    return config.drafter


def _check_assistant(model, assistant) -> None:
    try:
        check_model_supported(assistant)
    except UnsupportedModelError as err:
        raise UnsupportedModelError(f"assistant_model: {err}") from None
    target_vocab, draft_vocab = vocab_size(model), vocab_size(assistant)
    if target_vocab != draft_vocab:
        raise UnsupportedModelError(
            f"assistant_model has a vocabulary of {draft_vocab} tokens but the target has {target_vocab}: the draft "
            "model must share the target's tokenizer and vocabulary. Use a draft model of the same family, or "
            "drafter='ngram' / 'none'."
        )


def validate_generation(
    input_ids: torch.Tensor, generation_config: GenerationConfig, model_kwargs: dict, model_config=None
) -> None:
    """Raise :class:`UnsupportedGenerationError` for what TriForce cannot serve losslessly."""
    gc = generation_config
    copies = max(gc.num_beams or 1, gc.num_return_sequences or 1)  # generate() expands input_ids by this
    problems = {
        "beam search (num_beams > 1)": (gc.num_beams or 1) > 1,
        "num_return_sequences > 1": (gc.num_return_sequences or 1) > 1,
        "batch size > 1 (pass one sequence at a time)": input_ids.shape[0] // copies != 1,
        "an empty prompt": input_ids.shape[1] == 0,
        "use_cache=False": model_kwargs.get("use_cache") is False,
        "output_attentions / output_hidden_states": bool(gc.output_attentions or gc.output_hidden_states),
        "contrastive search (penalty_alpha)": bool(gc.penalty_alpha),
        "prompt_lookup_num_tokens / assistant_early_exit (TriForce drafts itself)": (
            gc.prompt_lookup_num_tokens is not None or gc.assistant_early_exit is not None
        ),
        "a padded attention_mask": _has_padding(model_kwargs.get("attention_mask")),
        "a pre-filled past_key_values": _has_past(model_kwargs.get("past_key_values")),
        "inputs_embeds": model_kwargs.get("inputs_embeds") is not None,
    }
    bad = [name for name, hit in problems.items() if hit]
    if bad:
        raise UnsupportedGenerationError(
            f"TriForce generation does not support {', '.join(bad)}. Drop triforce_config for this call, or change "
            "these options (TriForce serves greedy decoding and sampling of one sequence per call)."
        )
    _check_context_limit(input_ids.shape[1], gc.max_length, model_config)


def _check_context_limit(prompt: int, max_length: int, model_config) -> None:
    limit = getattr(model_config.get_text_config(), "max_position_embeddings", None) if model_config else None
    if limit is None or max_length <= limit:
        return
    if prompt >= limit:
        raise UnsupportedGenerationError(
            f"The prompt has {prompt} tokens but the model's context limit is {limit} "
            "(max_position_embeddings): shorten the prompt to fewer tokens than that."
        )
    raise UnsupportedGenerationError(
        f"{prompt} prompt tokens + {max_length - prompt} new tokens exceed the model's context limit of {limit} "
        f"(max_position_embeddings): set max_new_tokens to at most {limit - prompt} or shorten the prompt."
    )


def _has_padding(mask: torch.Tensor | None) -> bool:
    return mask is not None and not bool((mask == 1).all())


def _has_past(cache) -> bool:
    return cache is not None and cache.get_seq_length() > 0


def triforce_decode(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    *,
    triforce_config: TriForceConfig,
    assistant_model=None,
    drafter_kind: str = "ngram",
    triforce_streamer=None,
    **model_kwargs,
):
    """TriForce decoding with the call's logits processors and stopping criteria (``custom_generate``).

    Greedy output equals plain ``generate()``; sampled output has exactly its distribution.

    Returns:
        ``[1, prompt + new]`` token ids, or a ``GenerateDecoderOnlyOutput`` when
        ``return_dict_in_generate=True`` (``sequences``, and ``scores``/``logits`` when requested).
    """
    validate_generation(input_ids, generation_config, model_kwargs, model.config)
    run = _Run(model, input_ids, logits_processor, stopping_criteria, generation_config, triforce_config)
    run.generator = _build_generator(run, drafter_kind, assistant_model)
    with small_batch_linears(model, assistant_model):
        sequences = run.decode(streamer or triforce_streamer)
    model._hf_triforce_last_stats = run.stats
    if not generation_config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=run.scores, logits=run.raw_logits)


def _build_generator(run: _Run, drafter_kind: str, assistant_model) -> TriForceCandidateGenerator:
    cfg, gc = run.config, run.generation_config
    drafter = None
    if drafter_kind == "ngram":
        drafter = NGramDrafter(cfg.ngram_max, cfg.ngram_min)
    elif drafter_kind == "model":
        num_layers = assistant_model.config.get_text_config().num_hidden_layers
        cache = StreamingLLMCache(
            num_layers,
            cfg.draft_cache_budget,
            cfg.draft_sinks,
            rotary_inv_freq(assistant_model),
            evict_batch=min(16, (cfg.draft_cache_budget - cfg.draft_sinks - cfg.gamma1 - 1) // 2),
        )
        drafter = ModelDrafter(assistant_model, cache, run.logits_processor, bool(gc.do_sample))
        run.draft_cache = cache
    eos = gc.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return TriForceCandidateGenerator(
        run.model, run.cache, cfg, run.logits_processor, bool(gc.do_sample), drafter, gc.max_length, eos_ids, run.stats
    )


class _Run:
    """State of one TriForce generate call: the full cache, the sequence and the level-2 verification."""

    def __init__(self, model, input_ids, logits_processor, stopping_criteria, generation_config, config):
        self.model, self.input_ids = model, input_ids
        self.logits_processor, self.stopping_criteria = logits_processor, stopping_criteria
        self.generation_config, self.config = generation_config, config
        self.do_sample = bool(generation_config.do_sample)
        num_layers = model.config.get_text_config().num_hidden_layers
        capacity = generation_config.max_length + config.gamma2 + 2
        self.cache = RetrievalCache(num_layers, config.chunk_size, capacity)
        self.stats = TriForceStats()
        gc = generation_config
        self.scores = () if gc.return_dict_in_generate and gc.output_scores else None
        self.raw_logits = () if gc.return_dict_in_generate and gc.output_logits else None
        self.generator: TriForceCandidateGenerator | None = None
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
        with capturing_queries(self.model, self.generator.capture, keep) as capture_kwargs:
            out = self.model(
                input_ids=tokens,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=keep,
                **capture_kwargs,
            )
        return out.logits[:, -keep:].float()

    def _prefill(self, streamer) -> None:
        with self.stats.phases.measure("prefill"):
            logits = self._prefill_forward()
        self.generator.observe_prefill()
        raw = logits[:, -1]
        scores = self.logits_processor(self.input_ids, raw.clone())
        token = torch.multinomial(scores.softmax(-1), 1)[0] if self.do_sample else scores.argmax(-1)
        self._append(token, scores[None], raw[None], streamer)

    def _prefill_forward(self) -> torch.Tensor:
        """Prompt forward(s) into the full cache, with a progress bar for long prompts; last logits ``[1, 1, V]``."""
        prompt = self.input_ids.shape[1]
        step = self.config.prefill_chunk_size or prompt
        starts = range(0, prompt, step)
        if len(starts) == 1:
            with prefill_progress(self.model, prompt):
                return self._forward(self.input_ids, keep=1)
        for start in tqdm(
            starts, desc="TriForce prefill", unit="chunk", leave=False, disable=not show_progress(prompt)
        ):
            logits = self._forward(self.input_ids[:, start : start + step], keep=1)
        return logits

    def _round(self, streamer) -> None:
        cur = self.input_ids.shape[1]
        candidates, candidate_scores = self.generator.get_candidates(self.input_ids)
        drafts = candidates[0, cur:]
        g = drafts.shape[0]
        with self.stats.phases.measure("verify"):
            raw = self._forward(candidates[:, cur - 1 :], keep=g + 1)
        scores = torch.stack(
            [self.logits_processor(candidates[:, : cur + i], raw[:, i].clone()) for i in range(g + 1)], 1
        )
        if self.do_sample:
            q = None if candidate_scores is None else candidate_scores[0].softmax(-1)
            n_matches, next_token = verify_sampled(drafts, q, scores[0].softmax(-1))
        else:
            n_matches, next_token = verify_greedy(drafts, scores[0])
        valid = torch.cat([drafts[:n_matches], drafts.new_tensor([next_token])])
        appended = self._append(valid, scores[:, : n_matches + 1], raw[:, : n_matches + 1], streamer)
        self.cache.crop(-(g + 1 - appended))
        self.stats.target_forwards += 1
        self.stats.decoded_tokens += appended
        self.generator.update_candidate_strategy(self.input_ids, scores, n_matches)

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
