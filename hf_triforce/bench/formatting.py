"""How numbers are printed in the CLI output and the result tables: one way each.

``-`` stands for a figure that does not exist (nothing drafted, no such run, NaN).

Example:
    >>> number(0.8765, 2), number(float("nan")), mib(3 * 2**20), acceptance_rate({"drafted": 0})
    ('0.88', '-', '3.0 MiB', '-')
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "-"


def number(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, or ``-`` for None and NaN.

    Example:
        >>> number(1 / 3), number(None)
        ('0.333', '-')
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    return f"{value:.{digits}f}"


def tokens_per_second(run: dict[str, Any] | None, digits: int = 1) -> str:
    """A run's (``RunResult.to_dict()``) decode tokens per second, or ``-`` when there is no such run.

    Example:
        >>> tokens_per_second({"tokens_per_second": 12.345}, 2), tokens_per_second(None)
        ('12.35', '-')
    """
    return number(None if run is None else run["tokens_per_second"], digits)


def mib(n_bytes: int | None, digits: int = 1) -> str:
    """Bytes in MiB, e.g. ``"3.0 MiB"``, or ``-`` for None.

    Example:
        >>> mib(3 * 2**20), mib(3 * 2**20, 0), mib(None)
        ('3.0 MiB', '3 MiB', '-')
    """
    return MISSING if n_bytes is None else f"{n_bytes / 2**20:.{digits}f} MiB"


def acceptance_rate(level: dict[str, Any], digits: int = 2, counts: bool = False, none: str = MISSING) -> str:
    """A level's acceptance (``TriForceStats.to_dict()["levels"][...]``), or ``none`` when nothing was drafted.

    Args:
        level: ``{"drafted", "accepted", "acceptance_rate"}``; the round rate ``accepted / drafted`` is shown.
        digits: decimals of the rate.
        counts: also show ``(accepted/drafted)``.
        none: what to print when nothing was drafted.

    Example:
        >>> acceptance_rate({"drafted": 8, "accepted": 6, "acceptance_rate": 0.75}, counts=True)
        '0.75 (6/8)'
    """
    if not level["drafted"]:
        return none
    rate = f"{level['acceptance_rate']:.{digits}f}"
    return f"{rate} ({level['accepted']}/{level['drafted']})" if counts else rate


def per_token_acceptance(level: dict[str, Any], digits: int = 2, none: str = MISSING) -> str:
    """A level's per-token acceptance (the papers' alpha), or ``none`` when nothing was drafted or the stats were
    recorded before it existed.

    Example:
        >>> per_token_acceptance({"drafted": 18, "per_token_acceptance": 0.8}), per_token_acceptance({"drafted": 5})
        ('0.80', '-')
    """
    if not level["drafted"] or "per_token_acceptance" not in level:
        return none
    return f"{level['per_token_acceptance']:.{digits}f}"


def acceptances(level: dict[str, Any], digits: int = 2) -> str:
    """A table cell ``"round rate / per-token acceptance"`` of a level, or ``-`` when nothing was drafted.

    Example:
        >>> acceptances({"drafted": 18, "accepted": 8, "acceptance_rate": 8 / 18, "per_token_acceptance": 0.8})
        '0.44 / 0.80'
    """
    if not level["drafted"]:
        return MISSING
    return f"{acceptance_rate(level, digits)} / {per_token_acceptance(level, digits)}"


SLOW_CALLS = 1.5
"""A phase's cell adds its median when its mean is more than this many times the median (a few slow calls)."""


def phase_cell(phase: dict[str, Any] | None) -> str:
    """A table cell ``"ms per call (calls)"`` of a phase (the mean), or ``-`` if it never ran; ``"(calls; median
    ms)"`` when a few slow calls lift the mean above ``SLOW_CALLS`` times the median (older results have no median).

    Example:
        >>> phase_cell({"calls": 4, "ms_per_call": 2.5}), phase_cell(None)
        ('2.5 (4)', '-')
        >>> phase_cell({"calls": 28, "ms_per_call": 36.2, "ms_median": 5.1})
        '36.2 (28; median 5.1)'
    """
    if not phase or not phase["calls"]:
        return MISSING
    mean, median = phase["ms_per_call"], phase.get("ms_median")
    slow = median is not None and mean > SLOW_CALLS * median
    return f"{mean:.1f} ({phase['calls']}{f'; median {median:.1f}' if slow else ''})"
