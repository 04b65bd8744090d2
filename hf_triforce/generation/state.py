"""One state object per enabled model: what TriForce keeps on a model between ``generate()`` calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..hierarchy.calibration import StepCosts
from ..stats import TriForceStats

STATE_ATTR = "_hf_triforce"
"""The attribute holding the state (:func:`hf_triforce.enable` also sets ``generate`` and
``generation_config.triforce_config``)."""


@dataclass
class TriForceState:
    """What TriForce keeps on an enabled model."""

    last_stats: TriForceStats | None = None  # of the latest call, set when it finishes (None from its start until then)
    last_call_failed: bool = False  # the latest call started and did not finish
    level1_runner: tuple[tuple, Any] | None = None  # (key, runner): static_steps.RunnerSlot's, for the next call
    enabled: bool = True  # enable() routes generate(); False: only custom_generate calls' stats
    calibrations: dict[tuple, list[StepCosts]] = field(default_factory=dict)  # calibration.CalibrationSlot's

    def begin_call(self) -> None:
        """A call starts: the previous call's statistics are dropped, so nothing reads them as this call's."""
        self.last_stats, self.last_call_failed = None, True

    def finish_call(self, stats: TriForceStats) -> None:
        """The call finished: ``stats`` are its statistics."""
        self.last_stats, self.last_call_failed = stats, False


def state_of(model: torch.nn.Module) -> TriForceState | None:
    """The model's :class:`TriForceState`, or ``None``."""
    return model.__dict__.get(STATE_ATTR)


def attach_state(model: torch.nn.Module, enabled: bool = True) -> TriForceState:
    """Give ``model`` a fresh :class:`TriForceState` (replacing any) and return it."""
    state = TriForceState(enabled=enabled)
    model.__dict__[STATE_ATTR] = state
    return state


def detach_state(model: torch.nn.Module) -> None:
    """Drop the model's state (its kept runner's view storage is freed with it)."""
    model.__dict__.pop(STATE_ATTR, None)
