"""Pooled figures of ``hf-triforce eval-drafts`` results, shared by its report, its figure and the benchmark.

Acceptance figures are pooled over positions: ``sum of per-position acceptance / positions`` over every
row that matches (e.g. all natural prompts at one temperature).

Example:
    >>> rows = [{"kind": "retrieval", "accepted_sum": 3.0, "positions": 4}, {"kind": "streaming"}]
    >>> pooled(rows, kind="retrieval")
    (0.75, 4)
"""

from __future__ import annotations

import math
from typing import Any

import torch

NEEDLE_TARGET = 0.9
COPY_TARGETS = {1 / 8: 0.97, 1 / 16: 0.93}
"""Per-token level-1 acceptance at ``T = 0`` that copy tasks must reach at every depth, by budget fraction."""
KIND_ORDER = ("retrieval", "streaming")


def matching(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """The rows whose fields equal ``match``.

    Example:
        >>> matching([{"kind": "a", "t": 0}, {"kind": "b", "t": 0}], kind="a")
        [{'kind': 'a', 't': 0}]
    """
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def pooled(rows: list[dict[str, Any]], **match: Any) -> tuple[float, int]:
    """``(pooled acceptance, positions)`` of the rows whose fields equal ``match``.

    Example:
        >>> pooled([{"kind": "a", "accepted_sum": 3.0, "positions": 4}], kind="a")
        (0.75, 4)
    """
    chosen = matching(rows, **match)
    positions = sum(r["positions"] for r in chosen)
    if not positions:
        return float("nan"), 0
    return sum(r["accepted_sum"] for r in chosen) / positions, positions


def round_rate(rows: list[dict[str, Any]], **match: Any) -> float:
    """Replayed level-1 ``accepted / drafted`` over the matching view rows (``TriForceStats``' definition).

    Example:
        >>> round_rate([{"kind": "retrieval", "round_accepted": 9, "round_drafted": 12}], kind="retrieval")
        0.75
    """
    chosen = matching(rows, **match)
    drafted = sum(r.get("round_drafted", 0) for r in chosen)
    return sum(r.get("round_accepted", 0) for r in chosen) / drafted if drafted else float("nan")


def per_token(rows: list[dict[str, Any]], **match: Any) -> float:
    """Per-token level-1 acceptance of the replayed rounds of the matching rows: ``accepted / (accepted +
    rejections)``, the estimate ``TriForceStats.level1.per_token_acceptance`` reports (the papers' alpha).

    Example:
        >>> per_token([{"kind": "retrieval", "round_accepted": 18, "round_rejections": 2}], kind="retrieval")
        0.9
    """
    chosen = matching(rows, **match)
    accepted = sum(r.get("round_accepted", 0) for r in chosen)
    judged = accepted + sum(r.get("round_rejections", 0) for r in chosen)
    return accepted / judged if judged else float("nan")


def mean_refreshes(rows: list[dict[str, Any]], **match: Any) -> float:
    """Mean selections per replayed reference over the matching view rows (0 without any).

    Example:
        >>> mean_refreshes([{"kind": "retrieval", "refreshes": 9}, {"kind": "retrieval", "refreshes": 6}])
        7.5
    """
    chosen = matching(rows, **match)
    return sum(r["refreshes"] for r in chosen) / max(1, len(chosen))


def passage_task_kind(results: dict[str, Any]) -> str:
    """``"copy"`` when the results hold copy tasks (``--copy-tasks``), else ``"needle"``.

    Example:
        >>> passage_task_kind({"tasks": [{"kind": "natural"}, {"kind": "copy"}]})
        'copy'
    """
    return "copy" if any(t["kind"] == "copy" for t in results["tasks"]) else "needle"


def copy_target(fraction: float) -> float | None:
    """The copy-task target of a budget ``fraction`` (:data:`COPY_TARGETS`), None for a budget without one.

    Example:
        >>> copy_target(0.125), copy_target(0.25)
        (0.97, None)
    """
    return next((t for f, t in COPY_TARGETS.items() if math.isclose(f, fraction)), None)


def copy_kinds(results: dict[str, Any]) -> list[str]:
    """The passage kinds of the copy tasks in ``results``, in task order.

    Example:
        >>> copy_kinds({"tasks": [{"kind": "copy", "passage_kind": "code"}, {"kind": "natural"}]})
        ['code']
    """
    return list(dict.fromkeys(t["passage_kind"] for t in results["tasks"] if t["kind"] == "copy"))


def copy_verdict(results: dict[str, Any]) -> dict[str, Any]:
    """Copy tasks at ``T = 0``: per-token retrieval (and StreamingLLM) acceptance by budget and depth, pooled over
    passage kinds, against :data:`COPY_TARGETS`; ``met`` when every measured target budget reaches it at every
    depth.
    """
    main = [r for r in results["views"] if r["group"] == "main" and r["task_kind"] == "copy"]
    budgets = {}
    for fraction, target in COPY_TARGETS.items():
        measured = next((f for f in results["options"]["budget_fractions"] if math.isclose(f, fraction)), None)
        if measured is None:
            continue
        args = dict(budget_fraction=measured, temperature=0.0)
        depths = {
            f"{d:g}": {k: per_token(main, kind=k, depth=d, **args) for k in KIND_ORDER}
            for d in results["options"]["needle_depths"]
        }
        worst = min((v["retrieval"] for v in depths.values()), default=float("nan"))
        budgets[fraction_label(fraction)] = {"target": target, "depths": depths, "worst": worst, "met": worst >= target}
    return {"budgets": budgets, "met": bool(budgets) and all(b["met"] for b in budgets.values())}


def level0_pooled(rows: list[dict[str, Any]], **match: Any) -> tuple[float, float, float]:
    """``(acceptance of proposals, coverage, accepted per position)`` of the matching level-0 rows.

    Example:
        >>> level0_pooled([{"d": 1, "acceptance": 0.5, "proposals": 2, "positions": 4}], d=1)
        (0.5, 0.5, 0.25)
    """
    chosen = matching(rows, **match)
    proposals = sum(r["proposals"] for r in chosen)
    positions = sum(r["positions"] for r in chosen)
    accepted = sum(r["acceptance"] * r["proposals"] for r in chosen if r["proposals"])
    acc = accepted / proposals if proposals else float("nan")
    cov = proposals / positions if positions else float("nan")
    return acc, cov, (accepted / positions if positions else float("nan"))


def drafter_cost(name: str, num_layers: int | None) -> float:
    """Cost of one level-0 proposal relative to a level-1 step: 0 for none / n-gram, k / layers for model-kL.

    Example:
        >>> drafter_cost("model-4L", 30), drafter_cost("ngram", 30)
        (0.13333333333333333, 0.0)
    """
    if not name.startswith("model-"):
        return 0.0
    layers = int(name.removeprefix("model-").removesuffix("L"))
    return layers / num_layers if num_layers else float("nan")


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's must-show checks computed from ``results``.

    * ``needle``: at the headline budget and ``T = 0``, retrieval >= 0.9 at every needle depth (with
      StreamingLLM beside it);
    * ``natural``: retrieval >= StreamingLLM at every budget and temperature on natural continuations.
    """
    main = [r for r in results["views"] if r["group"] == "main"]
    headline = results["options"]["headline_fraction"]
    needle = {}
    for depth in results["options"]["needle_depths"]:
        args = dict(task_kind="needle", depth=depth, budget_fraction=headline, temperature=0.0)
        needle[str(depth)] = {kind: pooled(main, kind=kind, **args)[0] for kind in KIND_ORDER}
    natural = {}
    for fraction in results["options"]["budget_fractions"]:
        for t in results["options"]["temperatures"]:
            args = dict(task_kind="natural", budget_fraction=fraction, temperature=t)
            (r, positions), (s, _) = (pooled(main, kind=kind, **args) for kind in KIND_ORDER)
            margins = prompt_margins(main, **args)
            natural[f"{fraction:g}@T={t:g}"] = {"retrieval": r, "streaming": s, "positions": positions,
                                                "prompt_margins": margins}  # fmt: skip
    needle_ok = [v["retrieval"] >= NEEDLE_TARGET for v in needle.values() if not math.isnan(v["retrieval"])]
    natural_ok = [v["retrieval"] >= v["streaming"] for v in natural.values() if not math.isnan(v["retrieval"])]
    return {
        "needle": needle,
        "needle_met": bool(needle_ok) and all(needle_ok),
        "natural": natural,
        "natural_met": bool(natural_ok) and all(natural_ok),
    }


def prompt_margins(rows: list[dict[str, Any]], **match: Any) -> list[float]:
    """Per prompt of the matching rows, retrieval's accepted positions minus StreamingLLM's (expected positions at
    T > 0): how the pooled margin splits over the prompts, so a margin of a few positions can be told from noise.

    Example:
        >>> rows = [{"task": "natural#0", "kind": "retrieval", "accepted_sum": 60.0, "positions": 63},
        ...         {"task": "natural#0", "kind": "streaming", "accepted_sum": 62.0, "positions": 63}]
        >>> prompt_margins(rows)
        [-2.0]
    """
    chosen = matching(rows, **match)
    by_task: dict[str, dict[str, float]] = {}
    for r in chosen:
        by_task.setdefault(r["task"], {})[r["kind"]] = r["accepted_sum"]
    return [v["retrieval"] - v["streaming"] for v in by_task.values() if len(v) == 2]


def margin_interval(
    margins: list[float], level: float = 0.95, draws: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the pooled margin (the sum of :func:`prompt_margins`): the prompts resampled
    with replacement ``draws`` times (seeded, so a report renders the same twice), the central ``level`` of the sums.
    An interval that holds 0 says another draw of as many prompts could put either view ahead.

    Args:
        margins: per-prompt margins (retrieval's accepted positions minus StreamingLLM's), at least one.
        level: the share of the resampled sums the interval holds, in ``(0, 1)``.
        draws: resamples.
        seed: seed of the resampling.

    Returns:
        ``(low, high)`` in positions.

    Example:
        >>> margin_interval([2.0, 2.0, 2.0])
        (6.0, 6.0)
        >>> low, high = margin_interval([-3.0, 1.0, 2.0, -1.0]); low < -1.0 < high
        True
    """
    if not margins or not 0.0 < level < 1.0:
        raise ValueError(f"margin_interval needs at least one margin and 0 < level < 1, got {margins!r}, {level}.")
    values = torch.tensor(margins, dtype=torch.float64)
    picks = torch.randint(len(margins), (draws, len(margins)), generator=torch.Generator().manual_seed(seed))
    sums = values[picks].sum(dim=1)
    tail = (1.0 - level) / 2
    low, high = torch.quantile(sums, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return low, high


def budget_tokens(results: dict[str, Any], fraction: float) -> int:
    """The budget in tokens that a budget ``fraction`` of the context gave in ``results``.

    Example:
        >>> budget_tokens({"views": [{"budget_fraction": 0.125, "budget": 512}]}, 0.125)
        512
    """
    rows = [r for r in results["views"] if r["budget_fraction"] == fraction]
    return rows[0]["budget"] if rows else round(fraction * results["options"]["context_tokens"])


def budget_label(results: dict[str, Any], fraction: float) -> str:
    """``"512 (1/8)"``: a budget in tokens and as a fraction of the context.

    Example:
        >>> budget_label({"views": [{"budget_fraction": 0.125, "budget": 512}]}, 0.125)
        '512 (1/8)'
    """
    return f"{budget_tokens(results, fraction)} ({fraction_label(fraction)})"


def fraction_label(fraction: float) -> str:
    """``1/8`` for a unit fraction, else the number.

    Example:
        >>> fraction_label(0.125), fraction_label(0.3)
        ('1/8', '0.3')
    """
    inverse = 1 / fraction
    return f"1/{inverse:g}" if abs(inverse - round(inverse)) < 1e-9 else f"{fraction:g}"
