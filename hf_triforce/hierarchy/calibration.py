"""What a decoding call's steps cost on this device, measured once and then fixed.

The planner (:mod:`~hf_triforce.hierarchy.planner`) prices each round from these costs and the call's acceptance
counts, never from the clock of the round it is deciding: so the same seed gives the same text, whatever else the
machine is doing. The first call of its kind (its plan's forms and rows, the model's device and dtype) times its kinds
of step before its first round, by forwards whose results are discarded (:data:`TIMES` each, at the widths
:func:`level2_widths`, :func:`level1_widths` and :func:`level0_drafts` name); the model keeps the costs, and later
calls of the same kind reuse them (:func:`step_costs`) at contexts within :data:`CONTEXT_BAND` of the one they were
measured at, scaled by the bytes each level's forward reads (:class:`StepBytes`, from the model's shapes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..config import TriForceConfig
from .cost_model import StepCost

CONTEXT_BAND = 2.0
"""Costs measured at ``n`` tokens of context serve calls from ``n / 2`` to ``2 n`` tokens (scaled by their bytes);
outside that band a call measures its own: a step's fixed part and its width's cost do not follow the bytes."""


@dataclass(frozen=True)
class StepBytes:
    """Bytes one forward reads, from the model's shapes: the weights of level 2 (the model's) and of level 1 (its
    weight kind's copy), and the keys and values of one token of context (the full-attention layers').

    Example:
        >>> b = StepBytes(level2_weights=500, level1_weights=100, kv_per_token=10)
        >>> b.level2(40), b.level1(8)
        (900, 180)
    """

    level2_weights: int
    level1_weights: int
    kv_per_token: int

    def level2(self, context: int) -> int:
        """A full-cache forward over ``context`` tokens."""
        return self.level2_weights + context * self.kv_per_token

    def level1(self, view: int) -> int:
        """A level-1 forward over a ``view``-token view."""
        return self.level1_weights + view * self.kv_per_token


@dataclass
class StepCosts:
    """Seconds of each kind of step by width on one device, measured at ``context`` tokens of context and a
    ``view``-token level-1 view: level-2 forwards, level-1 forwards, level-0 proposals (by drafts asked), one
    re-selection. Measured while :attr:`measuring`, then fixed (:meth:`fix`).

    Example:
        >>> costs = StepCosts(context=7000, view=512)
        >>> costs.level2.observe(1, 0.08); costs.fix()
        >>> costs.measuring, round(costs.level2(1), 3)
        (False, 0.08)
    """

    context: int = 0
    view: int = 0
    level2: StepCost = field(default_factory=StepCost)
    level1: StepCost = field(default_factory=StepCost)
    level0: StepCost = field(default_factory=StepCost)
    refresh: StepCost = field(default_factory=StepCost)
    measuring: bool = True

    def fix(self) -> None:
        """The costs stay as measured."""
        self.measuring = False


class ScaledCost:
    """A :class:`~hf_triforce.hierarchy.cost_model.StepCost` read at ``factor`` times its measured seconds (the ratio
    of the bytes a step reads now to what it read when measured); observations go to the measured costs.

    Example:
        >>> cost = StepCost(); cost.observe(1, 0.010); cost.observe(3, 0.014)
        >>> scaled = ScaledCost(cost, 1.5)
        >>> round(scaled(3), 4), round(scaled.slope(), 4), scaled.fastest
        (0.021, 0.003, {1: 0.015, 3: 0.021})
    """

    def __init__(self, cost: StepCost, factor: float = 1.0) -> None:
        self.cost, self.factor = cost, factor

    def __call__(self, width: int) -> float | None:
        seconds = self.cost(width)
        return None if seconds is None else seconds * self.factor

    def slope(self) -> float | None:
        slope = self.cost.slope()
        return None if slope is None else slope * self.factor

    def observe(self, width: int, seconds: float) -> None:
        self.cost.observe(width, seconds)

    @property
    def known(self) -> bool:
        return self.cost.known

    @property
    def fastest(self) -> dict[int, float]:
        return {width: seconds * self.factor for width, seconds in self.cost.fastest.items()}


class CalibrationSlot(Protocol):
    """Where a model keeps its measured :class:`StepCosts` between calls (the enabled model's state): per kind of call
    (``key``: its plan's forms, rows, device and dtype), the costs measured at each context."""

    calibrations: dict[tuple, list[StepCosts]]


@dataclass(frozen=True)
class CallCosts:
    """The costs a call decides with: ``costs`` (measured before this call's first round while ``costs.measuring``,
    else measured earlier and read through ``level2_factor``/``level1_factor``)."""

    costs: StepCosts
    level2_factor: float = 1.0
    level1_factor: float = 1.0


def step_costs(
    slot: CalibrationSlot | None, key: tuple, context: int, view: int, step_bytes: StepBytes | None
) -> CallCosts:
    """The costs of a call of kind ``key`` at ``context`` tokens with a ``view``-token view: ones measured earlier at a
    context within :data:`CONTEXT_BAND` (the nearest; scaled by ``step_bytes``), else new ones this call measures and
    ``slot`` keeps once they are measured (:func:`keep_costs`).

    Example:
        >>> class Slot: calibrations = {}
        >>> slot, b = Slot(), StepBytes(1000, 200, 1)
        >>> first = step_costs(slot, ("k",), 1000, 100, b); first.costs.level2.observe(1, 0.2); first.costs.fix()
        >>> keep_costs(slot, ("k",), first.costs)
        >>> again = step_costs(slot, ("k",), 1500, 100, b)
        >>> again.costs is first.costs, round(again.level2_factor, 3)  # 2500 / 2000 bytes
        (True, 1.25)
        >>> step_costs(slot, ("k",), 4000, 100, b).costs.measuring  # out of the band: measured anew
        True
    """
    kept = [] if slot is None else slot.calibrations.get(key, [])
    near = [c for c in kept if max(c.context, context) <= CONTEXT_BAND * max(1, min(c.context, context))]
    if not near:
        return CallCosts(StepCosts(context, view))
    costs = min(near, key=lambda c: abs(c.context - context))
    if step_bytes is None:
        return CallCosts(costs)
    level2 = step_bytes.level2(context) / step_bytes.level2(costs.context)
    level1 = step_bytes.level1(view) / step_bytes.level1(costs.view)
    return CallCosts(costs, level2, level1)


def keep_costs(slot: CalibrationSlot | None, key: tuple, costs: StepCosts) -> None:
    """Keep fixed ``costs`` for later calls of kind ``key`` (once per context band: an earlier one near it stays)."""
    if slot is None or costs.measuring:
        return
    kept = slot.calibrations.setdefault(key, [])
    if all(c is not costs for c in kept):
        kept.append(costs)


TIMES = 2
"""Forwards timed per width; the faster counts (a width's first forward can pay one-time costs)."""
TREE_WIDTHS = (16, 64)
"""Wider verifications ``tree_budget='auto'`` is priced at, timed only where the narrow ones say a verified token is
cheap (:func:`tree_verification_widths`): elsewhere no tree can pay and the affine fit prices them."""


def level2_widths(config: TriForceConfig, has_drafter: bool) -> list[int]:
    """Full-cache forward widths to time: one token (a plain step), a level-1 round's ``gamma2 + 1`` and, with a
    drafter, a level-0 round's ``gamma1 + gamma2 + 1``.

    Example:
        >>> level2_widths(TriForceConfig(gamma1=2, gamma2=6), has_drafter=True)
        [1, 7, 9]
    """
    widths = {1, config.gamma2 + 1} | ({config.gamma1 + config.gamma2 + 1} if has_drafter else set())
    return sorted(widths)


def tree_verification_widths(costs: StepCosts) -> list[int]:
    """:data:`TREE_WIDTHS` to time after :func:`level2_widths`: all of them where the fit through those puts a
    16-token verification under twice a one-token one (width nearly free: trees may pay), else none.

    Example:
        >>> flat, steep = StepCosts(), StepCosts()
        >>> for w in (1, 7): flat.level2.observe(w, 0.043 + 0.0001 * w); steep.level2.observe(w, 0.075 + 0.01 * w)
        >>> tree_verification_widths(flat), tree_verification_widths(steep)
        ([16, 64], [])
    """
    one, wide = costs.level2(1), costs.level2(TREE_WIDTHS[0])
    return list(TREE_WIDTHS) if one is not None and wide is not None and wide < 2 * one else []


def level1_widths(config: TriForceConfig, has_drafter: bool, trees: bool) -> list[int]:
    """Level-1 forward widths to time: one token, ``gamma1 + 1`` with a drafter, 4 where trees may be drafted (a
    depth's frontier).

    Example:
        >>> level1_widths(TriForceConfig(gamma1=2), has_drafter=True, trees=False)
        [1, 3]
    """
    return sorted({1} | ({config.gamma1 + 1} if has_drafter else set()) | ({4} if trees else set()))


def level0_drafts(config: TriForceConfig) -> list[int]:
    """Level-0 proposal lengths to time: a level-1 step's ``gamma1`` and a level-0 round's ``gamma1 + gamma2``.

    Example:
        >>> level0_drafts(TriForceConfig(gamma1=2, gamma2=6))
        [2, 8]
    """
    return sorted({config.gamma1, config.gamma1 + config.gamma2})


def timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds ``run()`` takes on ``device`` (a CUDA device synchronized before and after).

    Example:
        >>> timed(lambda: None, torch.device("cpu")) >= 0
        True
    """
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
