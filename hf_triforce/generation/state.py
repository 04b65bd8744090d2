"""One state object per enabled model: what TriForce keeps on a model between ``generate()`` calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..stats import TriForceStats

STATE_ATTR = "_hf_triforce"
"""The one attribute :func:`hf_triforce.enable` sets on a model instance (besides the wrapped ``generate`` and
``generation_config.triforce_config``, the default config that transformers' own options mechanism carries)."""


@dataclass
class TriForceState:
    """What TriForce keeps on an enabled model.

    Attributes:
        last_stats: statistics of the latest TriForce ``generate()`` call (:func:`hf_triforce.last_stats`), set when
            it finishes; ``None`` from the start of every call until then, so a call that raised leaves none.
        last_call_failed: the latest TriForce call started and did not finish (it raised): its statistics were
            never recorded, and an earlier call's are gone.
        level1_runner: the static level-1 runner kept for the next call with the same shapes and weights
            (``(key, runner)``; see :func:`hf_triforce.hierarchy.static_steps.kept_runner`), or ``None``.
        enabled: :func:`hf_triforce.enable` routes the model's ``generate(..., triforce_config=...)``; ``False``: the
            state only keeps the statistics of ``generate(custom_generate=...)`` calls
            (:mod:`hf_triforce.generation.custom`).

    Example:
        >>> state = attach_state(model); state_of(model) is state  # doctest: +SKIP
        True
    """

    last_stats: TriForceStats | None = None
    last_call_failed: bool = False
    level1_runner: tuple[tuple, Any] | None = None
    enabled: bool = True

    def begin_call(self) -> None:
        """A TriForce call starts: the previous call's statistics are dropped, so nothing can read them as this
        call's (they are reported again only by :meth:`finish_call`)."""
        self.last_stats, self.last_call_failed = None, True

    def finish_call(self, stats: TriForceStats) -> None:
        """The call finished: ``stats`` are its statistics."""
        self.last_stats, self.last_call_failed = stats, False


def state_of(model: torch.nn.Module) -> TriForceState | None:
    """The model's :class:`TriForceState`, or ``None`` when TriForce is not enabled on it."""
    return model.__dict__.get(STATE_ATTR)


def attach_state(model: torch.nn.Module, enabled: bool = True) -> TriForceState:
    """Give ``model`` a fresh :class:`TriForceState` (replacing any) and return it."""
    state = TriForceState(enabled=enabled)
    model.__dict__[STATE_ATTR] = state
    return state


def detach_state(model: torch.nn.Module) -> None:
    """Drop the model's state (its kept runner's view storage is freed with it)."""
    model.__dict__.pop(STATE_ATTR, None)
