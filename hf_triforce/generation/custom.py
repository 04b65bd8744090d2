"""TriForce through transformers' own convention for decoding methods, without :func:`~hf_triforce.enable`:
:func:`triforce_generate` as a callable, :data:`CUSTOM_GENERATE_DIR` as a Hub repository (:func:`hub_generate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from ..config import TriForceConfig
from ..hf.generate import dropped_generate_arguments, routed_kwargs
from .call import prepare_triforce_call
from .plan import check_model
from .state import TriForceState, attach_state, state_of

CUSTOM_GENERATE_DIR = str(Path(__file__).resolve().parents[1] / "hub")
"""A local directory laid out as transformers expects a Hub repository's decoding method
(``custom_generate/generate.py``): ``model.generate(ids, custom_generate=CUSTOM_GENERATE_DIR, trust_remote_code=True,
triforce_config=cfg)``."""


def triforce_generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    *,
    triforce_config: TriForceConfig | dict | None = None,
    draft_model=None,
    **model_kwargs,
) -> Any:
    """TriForce as a transformers decoding method: ``generate(custom_generate=triforce_generate, ...)``.

    The same decoding as ``model.generate(..., triforce_config=cfg)`` after :func:`~hf_triforce.enable` (greedy
    output equal to plain ``generate()``, sampling with exactly its distribution); :func:`~hf_triforce.last_stats`
    reports the call.

    Args:
        model: the target causal LM (any model :func:`~hf_triforce.enable` accepts).
        input_ids: ``[B, n]`` the prompt, prepared by ``generate()`` (as are the next three).
        logits_processor: the call's processors.
        stopping_criteria: the call's stopping criteria.
        generation_config: the call's generation config.
        synced_gpus: unused.
        streamer: what transformers passes (nothing, for a callable).
        triforce_config: a :class:`~hf_triforce.config.TriForceConfig` or its ``to_dict()`` (default:
            ``TriForceConfig()``).
        draft_model: a small model of the same tokenizer for level 0 (or ``assistant_model=``), or ``None``.
        model_kwargs: the rest of ``generate()``'s model inputs (``attention_mask``, a ``cache`` to reuse, ...).

    Returns:
        what ``generate()`` returns: ``[B, n + new]`` ids, or a ``GenerateDecoderOnlyOutput``.

    Raises:
        TriForceError: the call cannot run (a subclass says what: model, generation arguments, device, config);
            ``UnsupportedGenerationError`` also when ``draft_model`` and another ``assistant_model`` are both given.

    Example:
        >>> from hf_triforce import TriForceConfig, triforce_generate
        >>> out = model.generate(ids, custom_generate=triforce_generate, triforce_config=TriForceConfig(),
        ...                      max_new_tokens=64)  # doctest: +SKIP
    """
    _state(model)
    dropped = dropped_generate_arguments()
    streamer = streamer if streamer is not None else dropped.get("streamer")
    generate_kwargs = {"assistant_model": dropped.get("assistant_model"), "draft_model": draft_model,
                       "streamer": streamer, "generation_config": generation_config}  # fmt: skip
    decode = prepare_triforce_call(model, triforce_config or TriForceConfig(), generate_kwargs)
    return decode(
        model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer, **model_kwargs
    )


def hub_generate(model, *args, triforce_config: TriForceConfig | dict | None = None, **kwargs) -> Any:
    """What :data:`CUSTOM_GENERATE_DIR` runs: ``generate()`` with all its arguments, TriForce as decoding method."""
    _state(model)
    kwargs = routed_kwargs(model, prepare_triforce_call, triforce_config or TriForceConfig(), kwargs)
    return type(model).generate(model, *args, **kwargs)  # the class's own, not the instance's wrapper


def _state(model: torch.nn.Module) -> TriForceState:
    """The model's state, made (after checking the model) on the first call without :func:`~hf_triforce.enable`."""
    state = state_of(model)
    if state is None:
        check_model(model)
        state = attach_state(model, enabled=False)
    return state
