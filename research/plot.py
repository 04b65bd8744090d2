"""The research bench's figure (``--plot``): speedup and per-level step latency against context length.

matplotlib is the optional ``research`` extra: it is imported when the figure is drawn, not when the package is, so
``hf-triforce`` and the tables work without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from hf_triforce.bench.machine import device_name

from .lab_report import phase_ms

LEVELS = (("level1", "level-1 step (retrieval view)"), ("level2", "level-2 verification (full cache)"))


def write_plot(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a PNG with two panels (speedup; ms per step of each level and of plain decoding) vs context.

    One line per (temperature, budget, drafter) series of ``results["rows"]`` (as written by
    ``hf-triforce bench``). Needs matplotlib (the ``research`` extra).

    Example:
        >>> write_plot(read_results("benchmarks/results/cpu-smollm2-7k.json"), "/tmp/bench.png")  # doctest: +SKIP
        PosixPath('/tmp/bench.png')
    """
    plt = pyplot()
    fig, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in _series(results["rows"]).items():
        x = [r["prompt_tokens"] for r in rows]
        speed.plot(x, [r["speedup"] for r in rows], marker="o", label=f"measured, {label}")
        lookup = [_lookup_speedup(r) for r in rows]
        if any(v == v for v in lookup):  # NaN where a row has no prompt-lookup run
            speed.plot(x, lookup, marker="^", linestyle=":", label=f"transformers prompt lookup, {label}")
        modeled = [(r.get("modeled_speedup") or {}).get("real_text_acceptance") for r in rows]
        if any(m is not None for m in modeled):
            nan = float("nan")
            modeled = [nan if m is None else m for m in modeled]
            speed.plot(x, modeled, marker="s", linestyle="--", label=f"modeled (real-text acceptance), {label}")
        latency.plot(
            x, [1e3 * r["plain"]["decode_seconds_per_token"] for r in rows], marker="o", label=f"plain, {label}"
        )
        for phase, name in LEVELS:
            ms = [phase_ms(r["triforce"]["triforce"]["phases"].get(phase)) for r in rows]
            latency.plot(x, ms, marker=".", linestyle="--", label=f"{name}, {label}")
    _decorate(speed, latency, results)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the non-interactive Agg backend (files only, no display needed)."""
    import matplotlib  # the optional `research` extra, and slow to import: only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _lookup_speedup(row: dict[str, Any]) -> float:
    """Prompt-lookup decoding's speedup over plain ``generate()`` in a row, NaN where it was not measured."""
    lookup = row.get("prompt_lookup")
    return (
        float("nan")
        if lookup is None
        else row["plain"]["decode_seconds_per_token"] / lookup["decode_seconds_per_token"]
    )


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    series: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["prompt_tokens"]):
        series.setdefault(f"T={r['temperature']}, budget {r['budget']}, {r['drafter']}", []).append(r)
    return series


def _decorate(speed, latency, results: dict[str, Any]) -> None:
    speed.axhline(1.0, color="gray", linewidth=0.8)
    title = f"Speedup, {device_name(results['machine'])}"
    speed.set(xlabel="context (prompt tokens)", ylabel="speedup over plain generate()", title=title)
    latency.set(xlabel="context (prompt tokens)", ylabel="ms per call", title="Step latency per level")
    for ax in (speed, latency):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
