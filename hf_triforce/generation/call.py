"""One TriForce ``generate()`` call: planned (:mod:`.plan`), wired (level 0, level 1, level 2) and run."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..caches.streaming import StreamingLLMCache
from ..config import DRAFT_SINKS, TriForceConfig, as_config
from ..hf.caches import callers_cache
from ..hf.facts import ModelFacts
from ..hf.generate import decoder_only_output
from ..hf.linears import level1_copy, swapped_linears
from ..hf.model import layer_rotary, num_layers, step_bytes
from ..hierarchy import Drafter, ModelDrafter, NGramDrafter
from ..hierarchy.calibration import StepBytes, keep_costs, step_costs
from ..stats import TriForceStats, timing_requested
from .loop import TriForceRun
from .plan import Call, CallPlan, check_generate_kwargs, plan_call
from .reuse import hand_back, start_cache
from .state import state_of

logger = logging.getLogger(__name__)


def prepare_triforce_call(model, triforce_config: TriForceConfig | dict, generate_kwargs: dict[str, Any]):
    """Refuse what must be refused before ``generate()`` prepares anything; the ``custom_generate`` callable.

    Pops ``assistant_model`` (or ``triforce_generate``'s ``draft_model``) from ``generate_kwargs``: TriForce runs
    the draft model itself.
    """
    state = state_of(model)
    if state is not None:
        state.begin_call()  # before any check: a refused call must not leave the last call's statistics
    config = as_config(triforce_config)
    facts = check_generate_kwargs(model, generate_kwargs)
    draft_model, assistant = generate_kwargs.pop("draft_model", None), generate_kwargs.pop("assistant_model", None)
    return functools.partial(
        triforce_decode,
        triforce_config=config,
        assistant_model=assistant if draft_model is None else draft_model,
        triforce_streamer=generate_kwargs.get("streamer"),
        model_facts=facts,
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
    triforce_streamer=None,
    model_facts: ModelFacts | None = None,
    **model_kwargs,
):
    """TriForce decoding with the call's logits processors and stopping criteria (``custom_generate``): ``[B, prompt +
    new]`` token ids, or a ``GenerateDecoderOnlyOutput`` (``return_dict_in_generate=True``), as plain ``generate()``."""
    streamer = streamer or triforce_streamer
    triforce_config = triforce_config.for_context(input_ids.shape[1])  # 'auto' sizes decided once, for this call
    call = Call(input_ids, generation_config, model_kwargs, streamer, stopping_criteria, assistant_model, model)
    plan = plan_call(model, triforce_config, call, model_facts)
    _note_a_view_that_holds_the_prompt(input_ids.shape[1], triforce_config)
    stats = TriForceStats(level1_weights=plan.level1_weights, level1_forward=plan.level1_forward)
    stats.phases.synchronize = timing_requested()
    with stats.phases.measure("reuse"):
        start = start_cache(
            model, triforce_config, input_ids, generation_config.max_length, callers_cache(model_kwargs), plan.batched
        )
    drafters = _drafters(triforce_config, plan, assistant_model, logits_processor, bool(generation_config.do_sample))
    mask = call.mask if plan.batched else None
    state, key = state_of(model), _cost_key(model, triforce_config, plan, assistant_model)
    context = input_ids.shape[1]
    view = min(context, triforce_config.retrieval_budget)
    costs = step_costs(state, key, context, view, _step_bytes(model, plan))
    run = TriForceRun(
        model, input_ids, mask, logits_processor, stopping_criteria, generation_config, triforce_config, plan,
        start.cache, start.reused, stats, drafters, runner_slot=state, costs=costs,
    )  # fmt: skip
    copy = level1_copy(model, plan.level1_weights) if plan.level1_forward == "transformers" else None
    with swapped_linears((model, assistant_model), copy):  # the weight kind, applied once for the call
        sequences = run.decode(streamer)
    keep_costs(state, key, run.level1.planner.costs)  # measured in this call's opening: later calls decide alike
    with stats.phases.measure("reuse"):
        returned = hand_back(start)
    state.finish_call(stats)
    if not generation_config.return_dict_in_generate:
        return sequences
    return decoder_only_output(sequences, run.scores, run.raw_logits, returned)


def _cost_key(model, config: TriForceConfig, plan: CallPlan, assistant_model) -> tuple:
    """What a call's step costs depend on beyond its context: the plan's forms and rows, the model's device and
    dtype, the settings that change a step's work, and the draft model."""
    parameter = next(model.parameters())
    draft = None if assistant_model is None else (type(assistant_model).__name__, assistant_model.num_parameters())
    forms = (plan.drafter, plan.rows, plan.batched, plan.level1_steps, plan.level1_forward, plan.level1_weights)
    settings = (config.chunk_size, config.rescore_candidates, config.draft_cache_budget, config.offload_kv)
    return (*forms, plan.draft_steps, str(parameter.device), parameter.dtype, *settings, draft)


def _step_bytes(model, plan: CallPlan) -> StepBytes:
    return StepBytes(*step_bytes(model, plan.level1_weights))


def _note_a_view_that_holds_the_prompt(prompt_tokens: int, config: TriForceConfig) -> None:
    """Log once per call when level 1's view is as large as the prompt: retrieval then selects the whole cache."""
    if prompt_tokens <= config.retrieval_budget:
        logger.warning(
            "hf_triforce: the prompt (%d tokens) is no longer than level 1's view (retrieval_budget=%d), so the view "
            "holds the whole cache and retrieval saves nothing (the output is unchanged); a retrieval_budget below "
            "the prompt length makes the view sparse.",
            prompt_tokens, config.retrieval_budget,
        )  # fmt: skip


def _drafters(
    config: TriForceConfig, plan: CallPlan, assistant_model, logits_processor, do_sample: bool
) -> list[Drafter] | None:
    """One level-0 drafter per row, of the plan's kind, or ``None`` (two levels)."""
    if plan.drafter == "none":
        return None
    if plan.drafter == "model":
        return [_model_drafter(config, plan, assistant_model, logits_processor, do_sample) for _ in range(plan.rows)]
    return [NGramDrafter() for _ in range(plan.rows)]


def _model_drafter(config: TriForceConfig, plan: CallPlan, assistant_model, logits_processor, do_sample: bool):
    """A draft-model drafter with its own StreamingLLM cache, on the plan's steps."""
    freqs, interleaved = layer_rotary(assistant_model)
    budget, evict_batch = config.draft_cache_budget, config.draft_evict_batch
    cache = StreamingLLMCache(num_layers(assistant_model), budget, DRAFT_SINKS, freqs, evict_batch, interleaved)
    drafter = ModelDrafter(assistant_model, cache, logits_processor, do_sample)
    drafter.use_static_steps(plan.draft_steps, strict=plan.strict_graphs)
    return drafter
