"""One TriForce ``generate()`` call: checked, wired (level 0, level 1, level 2) and run as ``custom_generate``."""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..caches.streaming import StreamingLLMCache
from ..config import TriForceConfig
from ..hf.caches import callers_cache
from ..hf.distributed import RankConsensus, check_same_random_state
from ..hf.generate import decoder_only_output
from ..hf.linears import small_batch_linears
from ..hf.model import layer_rotary, num_layers
from ..hierarchy import (
    Drafter,
    ModelDrafter,
    NGramDrafter,
    SuffixDrafter,
    level1_weights,
    runs_direct_forward,
    step_selection,
)
from ..stats import TriForceStats
from .loop import TriForceRun
from .offload_fit import check_offload_fits
from .reuse import hand_back, start_cache
from .state import state_of
from .validate import (
    as_config,
    check_assistant,
    check_cache_implementation,
    check_offload,
    is_batched,
    resolve_drafter,
    validate_batch,
    validate_generation,
)


def prepare_triforce_call(model, triforce_config: TriForceConfig | dict, generate_kwargs: dict[str, Any]):
    """Validate what can be checked from the call's kwargs and build the ``custom_generate`` callable.

    Pops ``assistant_model`` from ``generate_kwargs`` (TriForce runs the draft model itself).

    Example:
        >>> kwargs = {"max_new_tokens": 8}
        >>> decode = prepare_triforce_call(model, TriForceConfig(), kwargs)  # doctest: +SKIP
        >>> model.generate(ids, custom_generate=decode, **kwargs)  # doctest: +SKIP
    """
    state = state_of(model)
    if state is not None:
        state.begin_call()  # before any check: a refused call leaves no statistics behind, not the last call's
    config = as_config(triforce_config)
    check_cache_implementation(model, generate_kwargs)
    check_offload(config, model)
    direct = runs_direct_forward(config, model)  # a direct forward or static steps it cannot run raise now
    level1_weights(config, model, direct)  # so do weights it cannot draft with
    step_selection(config, direct)  # and per-step re-selection without the direct forward
    assistant = generate_kwargs.pop("assistant_model", None)
    drafter = resolve_drafter(config, assistant)
    if assistant is not None and drafter == "model":
        check_assistant(model, assistant)
    return functools.partial(
        triforce_decode,
        triforce_config=config,
        assistant_model=assistant if drafter == "model" else None,
        drafter_kind=drafter,
        triforce_streamer=generate_kwargs.get("streamer"),
    )


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

    Greedy output equals plain ``generate()``; sampled output has exactly its distribution. One loop serves one
    sequence and a batch (several rows, or a left-padded ``attention_mask``): each row equals plain batched
    ``generate()`` (:class:`~hf_triforce.generation.loop.TriForceRun`).

    A cache the caller passed (``cache=`` or ``past_key_values=``) holding a prefix of ``input_ids`` is reused:
    only the rest is prefilled, and the caller's cache ends holding ``sequences`` minus the last token, as after
    plain ``generate()`` (see :mod:`~hf_triforce.generation.reuse`).

    Returns:
        ``[B, prompt + new]`` token ids, or a ``GenerateDecoderOnlyOutput`` when
        ``return_dict_in_generate=True`` (``sequences``, the cache, and ``scores``/``logits`` when requested).
    """
    validate_generation(input_ids, generation_config, model_kwargs, model.config)
    check_offload_fits(model, triforce_config, input_ids.shape[0], generation_config.max_length)
    streamer = streamer or triforce_streamer
    batched = is_batched(input_ids, model_kwargs)
    consensus = RankConsensus.for_model(model)
    mask = None
    if batched:
        mask = validate_batch(
            model, input_ids, generation_config, model_kwargs, triforce_config, streamer, stopping_criteria
        )
    if generation_config.do_sample:  # tensor-parallel ranks must draw alike (a no-op on one process)
        check_same_random_state(consensus)
    stats = TriForceStats()
    with stats.phases.measure("reuse"):
        start = start_cache(
            model, triforce_config, input_ids, generation_config.max_length, callers_cache(model_kwargs), batched
        )
    do_sample, rows = bool(generation_config.do_sample), input_ids.shape[0]
    drafters = _drafters(triforce_config, drafter_kind, assistant_model, logits_processor, do_sample, rows)
    run = TriForceRun(
        model, input_ids, mask, logits_processor, stopping_criteria, generation_config, triforce_config, start.cache,
        start.reused, stats, drafters, batched, runner_slot=state_of(model),
    )  # fmt: skip
    with small_batch_linears(model, assistant_model):
        sequences = run.decode(streamer)
    with stats.phases.measure("reuse"):
        returned = hand_back(start)
    state_of(model).finish_call(stats)
    if not generation_config.return_dict_in_generate:
        return sequences
    return decoder_only_output(sequences, run.scores, run.raw_logits, returned)


def _drafters(
    config: TriForceConfig, drafter_kind: str, assistant_model, logits_processor, do_sample: bool, rows: int
) -> list[Drafter] | None:
    """One level-0 drafter per row of ``drafter_kind``: ``"suffix"``, ``"ngram"``, ``"model"`` (each with its own
    StreamingLLM cache of the draft model), or ``None`` for ``"none"`` (two levels)."""
    if drafter_kind == "none":
        return None
    if drafter_kind == "model":
        return [_model_drafter(config, assistant_model, logits_processor, do_sample) for _ in range(rows)]
    return [_row_drafter(config, drafter_kind) for _ in range(rows)]


def _row_drafter(config: TriForceConfig, drafter_kind: str) -> Drafter:
    if drafter_kind == "ngram":
        return NGramDrafter(config.ngram_max, config.ngram_min)
    return SuffixDrafter(config.suffix_min_match)


def _model_drafter(cfg: TriForceConfig, assistant_model, logits_processor, do_sample: bool) -> ModelDrafter:
    """A draft-model drafter with its own StreamingLLM cache."""
    freqs, interleaved = layer_rotary(assistant_model)
    cache = StreamingLLMCache(
        num_layers(assistant_model), cfg.draft_cache_budget, cfg.draft_sinks, freqs, cfg.draft_evict_batch, interleaved
    )
    return ModelDrafter(assistant_model, cache, logits_processor, do_sample)
