"""Everything a TriForce call checks before any work: the config, the drafter, the assistant, the generate options."""

from __future__ import annotations

import logging

import torch
from transformers import GenerationConfig

from ..config import TriForceConfig
from ..errors import TriForceConfigError, UnsupportedGenerationError, UnsupportedModelError
from ..hf.model import batched_attention_problem, check_model_supported, is_dispatched, vocab_size

logger = logging.getLogger(__name__)


def as_config(config) -> TriForceConfig:
    """A :class:`TriForceConfig` from a config or its ``to_dict()``; anything else raises ``TriForceConfigError``."""
    if isinstance(config, TriForceConfig):
        return config
    if isinstance(config, dict):
        return TriForceConfig.from_dict(config)
    raise TriForceConfigError(f"triforce_config must be a TriForceConfig or a dict, got {type(config).__name__}.")


def resolve_drafter(config: TriForceConfig, assistant) -> str:
    """The level-0 drafter kind, ``"model"``, ``"ngram"`` or ``"none"``, from ``config.drafter`` and the assistant."""
    if config.drafter == "auto":
        return "model" if assistant is not None else "ngram"
    if config.drafter == "model" and assistant is None:
        raise TriForceConfigError(
            "drafter='model' needs a draft model: pass assistant_model=<small model> to generate()."
        )
    if config.drafter != "model" and assistant is not None:
        logger.warning("assistant_model is ignored with drafter=%r.", config.drafter)
    return config.drafter


def check_assistant(model, assistant) -> None:
    """Raise :class:`UnsupportedModelError` unless ``assistant`` can draft for ``model`` (family, vocabulary)."""
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
    problems = {
        "beam search (num_beams > 1)": (gc.num_beams or 1) > 1,
        "an empty prompt": input_ids.shape[1] == 0,
        "use_cache=False": model_kwargs.get("use_cache") is False,
        "output_attentions / output_hidden_states": bool(gc.output_attentions or gc.output_hidden_states),
        "contrastive search (penalty_alpha)": bool(gc.penalty_alpha),
        "prompt_lookup_num_tokens / assistant_early_exit (TriForce drafts itself)": (
            gc.prompt_lookup_num_tokens is not None or gc.assistant_early_exit is not None
        ),
        "inputs_embeds": model_kwargs.get("inputs_embeds") is not None,
        "classifier-free guidance (guidance_scale; its processor runs the model one step at a time on a cache of "
        "its own, and TriForce judges several positions per forward)": gc.guidance_scale not in (None, 1, 1.0),
    }
    bad = [name for name, hit in problems.items() if hit]
    if bad:
        raise UnsupportedGenerationError(
            f"TriForce generation does not support {', '.join(bad)}. Drop triforce_config for this call, or change "
            "these options (TriForce serves greedy decoding and sampling)."
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


def is_batched(input_ids: torch.Tensor, model_kwargs: dict) -> bool:
    """Whether the call needs the batched loop: several rows, or one row with left padding."""
    mask = model_kwargs.get("attention_mask")
    return input_ids.shape[0] > 1 or (mask is not None and not bool((mask == 1).all()))


def validate_batch(
    model,
    input_ids: torch.Tensor,
    generation_config: GenerationConfig,
    model_kwargs: dict,
    config: TriForceConfig,
    streamer,
    stopping_criteria=(),
) -> torch.Tensor:
    """Raise :class:`UnsupportedGenerationError` for what a batched TriForce call (several rows, or a padded one)
    cannot serve; returns the ``[B, n]`` attention mask (all ones when none was given). Each refusal says why."""
    gc = generation_config
    mask = model_kwargs.get("attention_mask")
    mask = torch.ones_like(input_ids) if mask is None else mask
    rows = input_ids.shape[0]
    scored = bool(gc.return_dict_in_generate and (gc.output_scores or gc.output_logits))
    problems = {
        "a row whose last token is padding (pad batches on the left: tokenizer.padding_side = 'left')": bool(
            (mask[:, -1] == 0).any()
        ),
        "a row with no token (an all-zero attention_mask row)": bool((mask.sum(dim=1) == 0).any()),
        "a streamer with several rows (transformers' streamers take one row)": streamer is not None and rows > 1,
        "output_scores / output_logits with several rows (plain generate() scores the padding of rows that finished "
        "early, which TriForce never computes)": scored and rows > 1,
        "step_selection=True (run by the single-sequence direct forward; use False)": (config.step_selection is True),
        "level1_forward='direct' (the direct forward serves one unpadded sequence; use 'auto')": (
            config.level1_forward == "direct"
        ),
        "stop strings or stopping criteria without an eos_token_id (plain generate() then keeps decoding the rows "
        "they stop instead of padding them; pass eos_token_id=)": _stops_without_eos(stopping_criteria),
    }
    attention = batched_attention_problem(model)
    if attention is not None:
        problems[attention] = True
    bad = [name for name, hit in problems.items() if hit]
    if bad:
        raise UnsupportedGenerationError(
            f"Batched TriForce generation (batch size {rows}, or a padded attention_mask) does not support "
            f"{', '.join(bad)}. Change these options, or pass one unpadded sequence per call."
        )
    return mask


def _stops_without_eos(stopping_criteria) -> bool:
    """Whether a criterion other than the length limits may stop a row while no EOS criterion pads stopped rows."""
    names = {type(c).__name__ for c in stopping_criteria}
    has_eos = any(hasattr(c, "eos_token_id") for c in stopping_criteria)
    return not has_eos and bool(names - {"MaxLengthCriteria", "MaxTimeCriteria"})


def check_offload(config: TriForceConfig, model) -> None:
    """Refuse ``offload_kv=True`` for a model accelerate dispatched (its layers run on several devices, or are loaded
    at their forward): TriForce's offloaded cache streams every layer to the one device the model runs on.

    Example:
        >>> check_offload(TriForceConfig(offload_kv=True), torch.nn.Linear(2, 2))  # one device: nothing to refuse
    """
    if config.offload_kv and is_dispatched(model):
        raise UnsupportedGenerationError(
            "TriForceConfig(offload_kv=True) streams the full cache to the one device the model runs on, and this "
            "model is dispatched by accelerate (device_map over several devices, or offloaded weights): load it on "
            "one GPU (device_map='cuda'), or drop offload_kv."
        )


def check_cache_implementation(model, generate_kwargs: dict) -> None:
    """Refuse ``cache_implementation`` (static, offloaded, quantized, ...) before ``generate()`` builds that cache.

    TriForce keeps its own full cache, so the one ``cache_implementation`` asks for would be built and then not
    used: an option silently ignored.
    """
    config = generate_kwargs.get("generation_config") or model.generation_config
    implementation = generate_kwargs.get("cache_implementation", config.cache_implementation)
    if implementation not in (None, "dynamic"):
        raise UnsupportedGenerationError(
            f"TriForce generation does not support cache_implementation={implementation!r}: it keeps its own full "
            "cache (and level-1 view). Drop cache_implementation; to reuse a prefilled prefix, pass it as a "
            "DynamicCache with cache=."
        )
