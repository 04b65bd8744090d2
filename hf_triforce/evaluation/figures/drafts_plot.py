"""The figure of ``hf-triforce eval-drafts`` results: level-1 acceptance vs budget and vs needle depth.

Example:
    >>> write_eval_plot(read_results("benchmarks/results/eval-drafts.json"), "/tmp/eval.png")  # doctest: +SKIP
    PosixPath('/tmp/eval.png')
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ..drafts.summary import (
    KIND_ORDER,
    NEEDLE_TARGET,
    budget_label,
    budget_tokens,
    copy_kinds,
    copy_target,
    fraction_label,
    passage_task_kind,
    per_token,
    pooled,
)
from .pyplot import pyplot


def write_eval_plot(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """PNG with level-1 acceptance vs budget (natural text) and vs needle depth (headline budget); returns its path.

    One line per view kind (retrieval solid, StreamingLLM dashed) and temperature (one color each). With copy
    tasks (``--copy-tasks``) the depth panels are per-token acceptance at T=0, one line per passage kind, one
    panel per budget with a target (:data:`~hf_triforce.evaluation.drafts.summary.COPY_TARGETS`). Needs
    matplotlib (the ``bench`` extra).
    """
    plt = pyplot()
    copy_budgets = _copy_budgets(results)
    panels = 1 + max(1, len(copy_budgets))
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    _by_budget(axes[0], results, colors)
    if copy_budgets:
        for ax, fraction in zip(axes[1:], copy_budgets, strict=True):
            _copy_by_depth(ax, results, fraction, colors)
    else:
        _by_depth(axes[1], results, colors)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"{results.get('model_name', 'target')}: level-1 draft quality ({m['date'][:10]})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _lines(results: dict[str, Any], colors: list[str]):
    """``(temperature, kind, line style, color, label)`` of each line, in drawing order."""
    for i, t in enumerate(results["options"]["temperatures"]):
        for kind, style in zip(KIND_ORDER, ("-", "--"), strict=True):
            yield t, kind, style, colors[i % len(colors)], f"{kind}, T={t:g}"


def _by_budget(ax, results: dict[str, Any], colors: list[str]) -> None:
    """Natural continuation: pooled level-1 acceptance against the budget (log scale, zoomed in)."""
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main"]
    ticks = [budget_tokens(results, f) for f in o["budget_fractions"]]
    for t, kind, style, color, label in _lines(results, colors):
        y = [
            pooled(main, task_kind="natural", budget_fraction=f, temperature=t, kind=kind)[0]
            for f in o["budget_fractions"]
        ]
        ax.plot(ticks, y, style, marker="o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t}\n({fraction_label(f)})" for t, f in zip(ticks, o["budget_fractions"], strict=True)])
    ax.minorticks_off()
    ax.set(
        xlabel=f"budget (tokens of a {o['context_tokens']}-token context)",
        ylabel="level-1 acceptance",
        title="Natural continuation",
    )
    lowest = min((v for line in ax.get_lines() for v in line.get_ydata() if not math.isnan(v)), default=0.0)
    ax.set_ylim(max(0.0, lowest - 0.05), 1.0)  # natural text: the gaps are small, zoom in


def _by_depth(ax, results: dict[str, Any], colors: list[str]) -> None:
    """Needle tasks at the headline budget: pooled level-1 acceptance against the needle's depth."""
    o = results["options"]
    main = [r for r in results["views"] if r["group"] == "main"]
    depths, headline = o["needle_depths"], o["headline_fraction"]
    for t, kind, style, color, label in _lines(results, colors):
        args = dict(task_kind="needle", budget_fraction=headline, temperature=t, kind=kind)
        y = [pooled(main, depth=d, **args)[0] for d in depths]
        ax.plot(depths, y, style, marker="o", color=color, label=label)
    ax.axhline(NEEDLE_TARGET, color="gray", linewidth=0.8)
    ax.set(
        xlabel="needle depth in the document",
        ylabel="level-1 acceptance",
        title=f"Needle copy, budget {budget_label(results, headline)}",
    )
    ax.set_ylim(0, 1.02)


def _copy_budgets(results: dict[str, Any]) -> list[float]:
    """The measured budget fractions that have a copy-task target, smallest first ([] without copy tasks)."""
    if passage_task_kind(results) != "copy":
        return []
    fractions = results["options"]["budget_fractions"]
    return sorted(f for f in fractions if copy_target(f) is not None)


def _copy_by_depth(ax, results: dict[str, Any], fraction: float, colors: list[str]) -> None:
    """Copy tasks at T=0: per-token level-1 acceptance against depth, one line per passage kind."""
    main = [r for r in results["views"] if r["group"] == "main" and r["task_kind"] == "copy"]
    depths = results["options"]["needle_depths"]
    args = dict(budget_fraction=fraction, temperature=0.0)
    for i, kind in enumerate(copy_kinds(results)):
        y = [per_token(main, kind="retrieval", passage_kind=kind, depth=d, **args) for d in depths]
        ax.plot(depths, y, "-", marker="o", color=colors[i % len(colors)], label=f"retrieval, {kind}")
    streaming = [per_token(main, kind="streaming", depth=d, **args) for d in depths]
    ax.plot(depths, streaming, "--", marker="o", color="gray", label="StreamingLLM, all kinds")
    target = copy_target(fraction)
    ax.axhline(target, color="black", linewidth=0.8, label=f"target {target}")
    split = results["options"].get("copy_split") or ""
    ax.set(
        xlabel="passage depth in the haystack",
        ylabel="per-token level-1 acceptance (T=0)",
        title=f"Copy tasks ({split}), budget {budget_label(results, fraction)}",
    )
    ax.set_ylim(0, 1.02)
