"""Which level-1 view policies are measured: the main grid (every budget, retrieval and StreamingLLM) and the
selection-policy ablations at the headline budget, one knob at a time from the ``TriForceConfig`` defaults.

Example:
    >>> [(group, knob) for group, knob, *_ in policy_plan(EvalOptions(ablations=False))][:2]
    [('main', None), ('main', None)]
"""

from __future__ import annotations

import logging
from typing import Any

from ...config import TriForceConfig
from ...errors import TriForceConfigError
from .options import EvalOptions
from .view_policy import NEVER, ViewPolicy

logger = logging.getLogger(__name__)

# knob -> values tried at the headline budget; every other knob keeps its TriForceConfig default.
ABLATIONS: dict[str, list[Any]] = {
    "combine": ["sum", "max", "softmax", "attention"],
    "recent_window": [0, 16, 64, 128, 256],
    "chunk_size": [4, 8, 16, 32],
    "lookahead_chunks": [0, 1, 2, 3],
    "rescore_candidates": [0, 2, 4],
    "refresh_every": [1, 4, 8, 16, 32, NEVER],
    "refresh_below_acceptance": [None, 0.5, 0.8],
}


def default_policy(budget: int) -> ViewPolicy:
    """The retrieval policy of ``TriForceConfig()``'s defaults at ``budget``.

    Example:
        >>> default_policy(512).label
        'retrieval b512 c8 w128 a1 x4 sum r4'
    """
    return ViewPolicy.from_config(TriForceConfig(), budget=budget)


def policy_plan(options: EvalOptions) -> list[tuple[str, str | None, Any, float, ViewPolicy]]:
    """``(group, knob, value, budget fraction, policy)`` rows: the main grid, then the ablations."""
    plan = []
    for fraction in options.budget_fractions:
        budget = options.budget(fraction)
        plan.append(("main", None, None, fraction, default_policy(budget)))
        streaming = ViewPolicy(kind="streaming", budget=budget, sinks=options.streaming_sinks)  # same refreshes
        plan.append(("main", None, None, fraction, streaming))
    if not options.ablations:
        return plan
    fraction = options.headline_fraction
    base = default_policy(options.budget(fraction))
    for knob, values in ABLATIONS.items():
        for value in _with_default(values, getattr(base, knob)):
            try:
                plan.append(("ablation", knob, value, fraction, base.with_(**{knob: value})))
            except TriForceConfigError as err:
                logger.warning("skipping ablation %s=%s: %s", knob, value, err)
    return plan


def _with_default(values: list[Any], default: Any) -> list[Any]:
    """``values`` with the policy's own value added in order where it is not among them (a recent window that
    follows the budget can be any multiple of the chunk size).

    Example:
        >>> _with_default([0, 64, 256], 96), _with_default([0, 64], 64)
        ([0, 64, 96, 256], [0, 64])
    """
    if default in values or not isinstance(default, int):
        return values
    return sorted([*values, default], key=lambda v: (v is None, v))
