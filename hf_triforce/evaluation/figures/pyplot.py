"""matplotlib for the figures, and the drawing helpers they share.

matplotlib is the optional ``bench`` extra: it is imported when a figure is drawn, not when the package is,
so ``hf-triforce`` and the tables work without it.

Example:
    >>> plt = pyplot()  # doctest: +SKIP
    >>> fig, ax = plt.subplots()  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from ..common.machine import device_line


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` with the non-interactive Agg backend (files only, no display needed)."""
    import matplotlib  # the optional `bench` extra, and slow to import: only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def grouped_bars(ax, labels: list[str], series: list[tuple[str, list[float]]]) -> None:
    """Draw each ``(name, values)`` series as one bar per label, the series side by side within a group."""
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        offsets = [i - 0.4 + width * (k + 0.5) for i in range(len(labels))]
        ax.bar(offsets, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def save(fig, ax, path: Path, results: dict[str, Any]) -> Path:
    """Caption ``fig`` with the device line of ``results``, add ``ax``'s legend, write it to ``path`` and close it."""
    if ax is not None:
        ax.legend(fontsize=7)
    fig.text(0.01, 0.005, device_line(results), fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
