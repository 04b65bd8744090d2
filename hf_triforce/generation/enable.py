"""The public switches: :func:`enable`, :func:`disable` and :func:`last_stats`."""

from __future__ import annotations

import torch

from ..errors import NoStatsError
from ..hf.direct_forward import drop_direct_decoder
from ..hf.generate import unwrap_generate, wrap_generate
from ..hf.linears import drop_int8_copy
from ..stats import TriForceStats
from .call import prepare_triforce_call
from .plan import check_model
from .state import attach_state, detach_state, state_of


def enable(model: torch.nn.Module) -> torch.nn.Module:
    """Opt a model instance in to TriForce: ``model.generate(..., triforce_config=cfg)``.

    Idempotent, per instance; ``generate()`` without ``triforce_config`` is unchanged. Pipelines pass
    ``triforce_config`` on; ``model.generation_config.triforce_config = cfg`` sets a default.

    Args:
        model: a transformers causal LM TriForce can serve (the documentation's Supported models page).

    Returns:
        the same model.

    Raises:
        UnsupportedModelError: TriForce cannot serve the model (the documentation's What runs together page).

    Example:
        >>> hf_triforce.enable(model)  # doctest: +SKIP
        >>> out = model.generate(input_ids, max_new_tokens=64, triforce_config=TriForceConfig())  # doctest: +SKIP
    """
    check_model(model)
    state = state_of(model)
    if state is not None and state.enabled:
        return model
    wrap_generate(model, prepare_triforce_call)
    if state is None:
        attach_state(model)
    else:  # keeps the statistics of earlier generate(custom_generate=...) calls
        state.enabled = True
    return model


def disable(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable`: ``generate()`` is the class's own again, and what TriForce kept is freed. Idempotent.

    Example:
        >>> hf_triforce.disable(model)  # doctest: +SKIP
    """
    state = state_of(model)
    if state is not None:
        if state.enabled:
            unwrap_generate(model)
        detach_state(model)
    drop_int8_copy(model)
    drop_direct_decoder(model)
    return model


def is_enabled(model: torch.nn.Module) -> bool:
    """Whether :func:`enable` was called on ``model`` (and not undone).

    Example:
        >>> hf_triforce.is_enabled(model)  # doctest: +SKIP
        True
    """
    state = state_of(model)
    return state is not None and state.enabled


def last_stats(model: torch.nn.Module) -> TriForceStats:
    """Statistics of the model's most recent TriForce ``generate()`` call.

    Each level reports ``acceptance_rate`` (``accepted / drafted``) and ``per_token_acceptance``, the papers'
    ``alpha`` (see :class:`~hf_triforce.stats.LevelStats`).

    Raises:
        NoStatsError: no TriForce generation has run on this model, or the latest one raised before finishing (each
            call drops the previous call's statistics when it starts).

    Example:
        >>> level1 = hf_triforce.last_stats(model).level1  # doctest: +SKIP
        >>> round(level1.acceptance_rate, 2), round(level1.per_token_acceptance, 2)  # doctest: +SKIP
        (0.93, 0.96)
    """
    state = state_of(model)
    if state is not None and state.last_call_failed:
        raise NoStatsError(
            "The latest TriForce generate() call on this model raised before it finished, so it recorded no "
            "statistics (and the previous call's were dropped when it started): rerun the call that failed."
        )
    if state is None or state.last_stats is None:
        raise NoStatsError(
            "No TriForce generation has run on this model yet: call model.generate(..., triforce_config=...)."
        )
    return state.last_stats
