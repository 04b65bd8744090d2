"""Level-1 acceptance measured with a real model on real text, for the modeled speedup of a random-weights run.

A random-weights shape (``--preset``) measures honest step latencies but meaningless acceptance. The
modeled speedup combines those latencies with a given rate, or with the acceptance the real SmolLM2-135M-Instruct
reached on natural text in a recorded draft-quality result (``benchmarks/results/eval-drafts.json``, written by
hf_triforce 0.2's ``hf-triforce eval-drafts``, since removed), at the recorded budget fraction nearest to the run's
``budget / context`` and the same temperature.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hf_triforce.errors import TriForceConfigError

DEFAULT_PATH = Path("benchmarks/results/eval-drafts.json")


@dataclass(frozen=True)
class RealAcceptance:
    """A per-position level-1 acceptance rate and where it was measured."""

    level1: float
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_real_acceptance(value: str | None, preset: str | None) -> str | float | None:
    """The ``--real-acceptance`` option: a rate in (0, 1], a results path, or ``None``.

    Without the option a random-weights run (``preset``) uses :data:`DEFAULT_PATH` when it exists.

    Raises:
        ValueError: a number outside (0, 1] or a path that does not exist.
    """
    if value is None:
        return str(DEFAULT_PATH) if preset is not None and DEFAULT_PATH.is_file() else None
    try:
        rate = float(value)
    except ValueError:
        if not Path(value).is_file():
            raise TriForceConfigError(
                f"--real-acceptance {value}: no such file (an eval-drafts JSON or a rate)."
            ) from None
        return value
    if not 0.0 < rate <= 1.0:
        raise TriForceConfigError(f"--real-acceptance {value}: an acceptance rate must lie in (0, 1].")
    return rate


def real_acceptance(spec: str | float, budget: int, context: int, temperature: float) -> RealAcceptance:
    """The level-1 acceptance for a run of ``budget`` tokens over ``context``, from ``spec``.

    Args:
        spec: a rate (used as given) or the path of a recorded eval-drafts results JSON.
        budget: the run's retrieval budget in tokens.
        context: the run's prompt length in tokens.
        temperature: the run's sampling temperature (the nearest recorded one is used).

    Example:
        >>> real_acceptance(0.9, 4096, 122880, 0.0).level1
        0.9
    """
    if isinstance(spec, float):
        return RealAcceptance(spec, "given on the command line")
    return _from_eval_drafts(read_results(spec), budget / context, temperature, spec)


def _from_eval_drafts(results: dict[str, Any], fraction: float, temperature: float, path: str) -> RealAcceptance:
    views = [v for v in results["views"] if v["group"] == "main" and v["task_kind"] == "natural"]
    views = [v for v in views if v["kind"] == "retrieval"]
    if not views:
        raise TriForceConfigError(f"{path} holds no natural-text retrieval rows: is it an eval-drafts result?")
    near_f = _nearest({v["budget_fraction"] for v in views}, fraction, log=True)
    near_t = _nearest({v["temperature"] for v in views}, temperature)
    chosen = [v for v in views if v["budget_fraction"] == near_f and v["temperature"] == near_t]
    positions = sum(v["positions"] for v in chosen)
    rate = sum(v["accepted_sum"] for v in chosen) / positions if positions else float("nan")
    budget = next(v["budget"] for v in views if v["budget_fraction"] == near_f)
    context = results["options"]["context_tokens"]
    source = (
        f"{results.get('model_name', 'real model')}, natural text, budget {budget} of {context} tokens "
        f"(1/{round(1 / near_f)}), T={near_t:g}, {positions} positions ({os.path.basename(path)})"
    )
    return RealAcceptance(rate, source)


def _nearest(values: set[float], target: float, log: bool = False) -> float:
    """The element of ``values`` nearest ``target`` (on a log scale for ratios)."""
    if log:
        return min(values, key=lambda v: abs(math.log(v) - math.log(target)))
    return min(values, key=lambda v: abs(v - target))


def read_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON result at ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON.
    """
    return json.loads(Path(path).read_text())
