"""Whether other processes took the CPU cores a timed run needed, and repeating a run until they did not.

Speed measured while another process takes a core that torch's threads need is meaningless: the threads
wait for each other at every operator (20x slower seen). :func:`measure_quietly` samples ``/proc/stat``
around a run and repeats it while the cores its threads lacked exceed :data:`MAX_CORES_LACKED`.

Example:
    >>> result, lacked = measure_quietly(lambda: measure(model, ids, max_new_tokens=32))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .timed_run import RunResult

logger = logging.getLogger(__name__)

MAX_CORES_LACKED = 0.25  # idle cores short of this run's threads above which a timed run is not comparable


def measure_quietly(
    run: Callable[[], RunResult], attempts: int = 3, max_cores_lacked: float = MAX_CORES_LACKED, wait_s: float = 20.0
) -> tuple[RunResult, float | None]:
    """``run()``, repeated (up to ``attempts``) while other processes used the CPU during it.

    Returns the least disturbed run and how many cores its threads lacked on average (``None`` where
    ``/proc/stat`` is unavailable). Speed measured while another process takes a core that torch's
    threads need is meaningless: its threads wait for each other at every operator (20x slower seen).
    """
    best: tuple[RunResult, float | None] | None = None
    for attempt in range(attempts):
        before = _cpu_seconds()
        result = run()
        busy = _contention(before, _cpu_seconds())
        if best is None or (busy is not None and best[1] is not None and busy < best[1]):
            best = (result, busy)
        if busy is None or busy <= max_cores_lacked or attempt + 1 == attempts:
            break
        logger.warning("other processes used %.2f cores during the run (attempt %d); retrying", busy, attempt + 1)
        time.sleep(wait_s)
    return best


def _cpu_seconds() -> tuple[float, float, float] | None:
    """``(wall, busy CPU seconds of the machine, CPU seconds of this process)``, or None off Linux."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    busy = (sum(values) - values[3] - values[4]) / tick  # all but idle and iowait
    own = os.times()
    return time.perf_counter(), busy, own.user + own.system


def _contention(before, after) -> float | None:
    """Cores this run's threads lacked: other processes' busy cores beyond those its threads left free.

    Between two :func:`_cpu_seconds` samples, other processes kept ``other`` cores busy on average;
    with ``threads`` torch threads on ``cpus`` cores, up to ``cpus - threads`` of them cost nothing.
    """
    if before is None or after is None:
        return None
    wall = after[0] - before[0]
    if wall <= 0:
        return None
    other = max((after[1] - before[1]) - (after[2] - before[2]), 0.0) / wall
    free = max((os.cpu_count() or 1) - torch.get_num_threads(), 0)
    return max(other - free, 0.0)
