"""Where a TriForce call spends its time, operator by operator, per phase (torch.profiler)."""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

PHASE_PREFIX = "triforce::"  # the record_function ranges of hf_triforce.stats.PhaseTimes.measure


def profile_phases(model, input_ids: torch.LongTensor, top: int = 6, **generate_kwargs) -> dict[str, Any]:
    """Run ``model.generate(input_ids, **generate_kwargs)`` under torch.profiler; the cost of each phase.

    Args:
        model: a TriForce-enabled model (``hf_triforce.enable``).
        input_ids: ``[1, n]`` prompt ids.
        top: operators kept per phase (by self time).
        generate_kwargs: arguments of ``generate()``, including ``triforce_config``.

    Returns:
        ``{phase: {"calls": int, "ms_per_call": float, "ops": {aten op: self ms per call}}}`` for the
        phases of :class:`hf_triforce.stats.PhaseTimes` (``level1``, ``level2``, ...), host time.

    Example:
        >>> profile_phases(model, ids, max_new_tokens=32, triforce_config=cfg)["level2"]["ops"]  # doctest: +SKIP
        {'aten::_scaled_dot_product_flash_attention_for_cpu': 70.6, 'aten::mm': 44.2, ...}
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if input_ids.is_cuda else [])
    with profile(activities=activities) as prof:
        model.generate(input_ids, **generate_kwargs)
    return summarize(prof.events(), top)


def summarize(events, top: int = 6) -> dict[str, Any]:
    """Group profiler ``events`` under their ``triforce::<phase>`` range; see :func:`profile_phases`."""
    calls, total = collections.Counter(), collections.Counter()
    ops: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in events:
        if event.name.startswith(PHASE_PREFIX):
            phase = event.name[len(PHASE_PREFIX) :]
            calls[phase] += 1
            total[phase] += event.cpu_time_total
            _add_descendants(event, ops[phase])
    return {
        phase: {
            "calls": n,
            "ms_per_call": total[phase] / n / 1e3,
            "ops": {name: us / n / 1e3 for name, us in ops[phase].most_common(top)},
        }
        for phase, n in calls.items()
    }


def _add_descendants(event, counter: collections.Counter) -> None:
    for child in event.cpu_children:
        counter[child.name] += child.self_cpu_time_total
        _add_descendants(child, counter)
