"""The hook into ``generate()`` (which rejects unknown kwargs): ``triforce_config`` routes a call to
``custom_generate``; outputs; stop strings."""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from transformers import StoppingCriteriaList, StopStringCriteria
from transformers.generation import GenerateDecoderOnlyOutput, GenerationMixin

from ..errors import NotEnabledError
from .versions import CACHE_ARG

Handler = Callable[[torch.nn.Module, Any, dict[str, Any]], Callable]
"""``handler(model, triforce_config, generate_kwargs) -> custom_generate callable`` (may edit the kwargs)."""


def wrap_generate(model: torch.nn.Module, handler: Handler) -> None:
    """Route ``model.generate(..., triforce_config=cfg)`` (or ``cfg`` from the call's or the model's
    ``generation_config``) through ``custom_generate=handler(model, cfg, kwargs)`` (undo: :func:`unwrap_generate`)."""
    plain_generate = model.generate

    @functools.wraps(plain_generate)
    def generate(*args, triforce_config=None, **kwargs):
        triforce_config = triforce_config or getattr(kwargs.get("generation_config"), "triforce_config", None)
        triforce_config = triforce_config or getattr(model.generation_config, "triforce_config", None)
        if triforce_config is None:
            return plain_generate(*args, **kwargs)
        return plain_generate(*args, **routed_kwargs(model, handler, triforce_config, kwargs))

    model.generate = generate
    model.generation_config.triforce_config = None


NOT_ENABLED = (
    "generate() got triforce_config, but hf_triforce.enable(model) was not called on this model (or "
    "hf_triforce.disable(model) undid it), so transformers does not know the argument. Call hf_triforce.enable(model) "
    "once after loading it; or, without enable(), pass custom_generate=hf_triforce.triforce_generate as well."
)


def install_enable_hint() -> bool:
    """Make ``generate(triforce_config=...)`` on a model never :func:`~hf_triforce.enable`\\ d raise
    :class:`~hf_triforce.errors.NotEnabledError` naming ``hf_triforce.enable(model)`` instead of transformers'
    "model_kwargs are not used" (the likeliest first mistake). Idempotent; returns whether the hint is installed.

    It wraps ``GenerationMixin._validate_model_kwargs`` (present in every supported release; where a release lacks
    it, nothing is patched and transformers' own error stands). The wrapper only looks for a ``triforce_config``
    left in the model kwargs, which an enabled model's ``generate()`` and ``custom_generate=triforce_generate`` both
    take out before: every other call reaches transformers' check unchanged.

    Example:
        >>> install_enable_hint()
        True
    """
    validate = getattr(GenerationMixin, "_validate_model_kwargs", None)
    if validate is None:
        return False
    if getattr(validate, "_hf_triforce_hint", False):
        return True

    @functools.wraps(validate)
    def validate_model_kwargs(self, model_kwargs, *args, **kwargs):
        if model_kwargs.get("triforce_config") is not None:
            raise NotEnabledError(NOT_ENABLED)
        return validate(self, model_kwargs, *args, **kwargs)

    validate_model_kwargs._hf_triforce_hint = True
    GenerationMixin._validate_model_kwargs = validate_model_kwargs
    return True


def effective_cache_implementation(model: torch.nn.Module, generate_kwargs: dict[str, Any]) -> str | None:
    """The ``cache_implementation`` that ``generate()`` will act on for a call with ``generate_kwargs``, read
    through transformers' own preparation (which drops e.g. Gemma checkpoints' Hub default ``"hybrid"``)."""
    given = generate_kwargs.get("cache_implementation")
    kwargs = {} if given is None else {"cache_implementation": given}
    config, _ = model._prepare_generation_config(generate_kwargs.get("generation_config"), **kwargs)  # copies it
    return config.cache_implementation


def routed_kwargs(model: torch.nn.Module, handler: Handler, triforce_config: Any, kwargs: dict[str, Any]) -> dict:
    """``generate()``'s ``kwargs`` for a TriForce call: stop strings as a criterion, ``custom_generate`` set."""
    decode = handler(model, triforce_config, kwargs)  # refuses what TriForce cannot serve, before anything moves
    _move_stop_strings(model, kwargs)
    kwargs["custom_generate"] = decode
    return kwargs


def dropped_generate_arguments(depth: int = 2) -> dict[str, Any]:
    """``streamer`` and ``assistant_model`` of the ``generate()`` call ``depth`` frames up, else ``{}``.

    transformers 5.17-5.24 hand a ``custom_generate`` callable only its own extra parameters, not these.

    Example:
        >>> dropped_generate_arguments()  # not inside generate()
        {}
    """
    try:
        frame = sys._getframe(depth)
    except ValueError:  # the call stack is not that deep
        return {}
    if frame.f_code.co_name != "generate" or frame.f_globals.get("__name__") != _GENERATE_MODULE:
        return {}
    found = {name: frame.f_locals.get(name) for name in ("streamer", "assistant_model")}
    return {name: value for name, value in found.items() if value is not None}


_GENERATE_MODULE = "transformers.generation.utils"


def unwrap_generate(model: torch.nn.Module) -> None:
    """Undo :func:`wrap_generate`: ``generate()`` is the class's own again."""
    model.__dict__.pop("generate", None)
    if hasattr(model.generation_config, "triforce_config"):
        del model.generation_config.triforce_config


def decoder_only_output(
    sequences: torch.LongTensor, scores: tuple | None, logits: tuple | None, cache: Any = None
) -> GenerateDecoderOnlyOutput:
    """The ``return_dict_in_generate=True`` output (the cache under the installed release's name)."""
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, **{CACHE_ARG: cache})


def pad_token_id(generation_config) -> int | None:
    """The pad id ``generate()`` pads finished rows with (``pad_token_id``, or the EOS id it substitutes)."""
    tensor = getattr(generation_config, "_pad_token_tensor", None)
    if tensor is not None:
        return int(tensor.reshape(-1)[0])
    return generation_config.pad_token_id


def eos_token_ids(generation_config) -> list[int]:
    """The call's end-of-sequence ids as a list.

    Example:
        >>> from transformers import GenerationConfig
        >>> eos_token_ids(GenerationConfig(eos_token_id=2)), eos_token_ids(GenerationConfig())
        ([2], [])
    """
    eos = generation_config.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


def _move_stop_strings(model, kwargs: dict[str, Any]) -> None:
    """Turn ``stop_strings`` into a ``StopStringCriteria`` (with ``custom_generate``, transformers 5.x drops the
    ``tokenizer`` that stop strings need)."""
    config = kwargs.get("generation_config") or model.generation_config
    stop_strings = kwargs.pop("stop_strings", None) or config.stop_strings
    if stop_strings is None:
        return
    tokenizer = kwargs.pop("tokenizer")  # the call's plan refused stop strings without it
    if config.stop_strings is not None:
        kwargs["generation_config"] = copy.deepcopy(config)
        kwargs["generation_config"].stop_strings = None
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer, stop_strings))
    kwargs["stopping_criteria"] = criteria
