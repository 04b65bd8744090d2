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

from ..drafts.summary import KIND_ORDER, NEEDLE_TARGET, budget_label, budget_tokens, fraction_label, pooled
from .pyplot import pyplot


def write_eval_plot(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """PNG with level-1 acceptance vs budget (natural text) and vs needle depth (headline budget); returns its path.

    One line per view kind (retrieval solid, StreamingLLM dashed) and temperature (one color each). Needs
    matplotlib (the ``bench`` extra).
    """
    plt = pyplot()
    fig, (by_budget, by_depth) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    _by_budget(by_budget, results, colors)
    _by_depth(by_depth, results, colors)
    for ax in (by_budget, by_depth):
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
