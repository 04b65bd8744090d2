"""The bench's headline figures: medians over prompts against best plain.

A row whose answer loops (:func:`~hf_triforce.bench.repetition.loops`) is left out of every summary:
n-gram drafting predicts a loop perfectly, so its speedup says nothing about natural text. The ratio to
``generate()``'s defaults stays beside the one to the fastest plain decoding measured ("best plain").
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (temperature, budget, drafter, tree budget): medians over the prompts whose answers do not loop.

    Each entry: ``temperature``, ``budget``, ``drafter``, ``tree_budget``, ``prompts`` (rows summarized),
    ``left_out`` (names of the prompts whose answers loop), ``median_speedup_best_plain``, ``median_speedup_default``,
    ``median_triforce_tokens_per_second``, ``median_best_plain_tokens_per_second``, ``best_plain`` (the fastest
    plain decoding of each summarized row, by name), ``identical`` (greedy rows with identical text, of
    ``prompts``; None when sampled) and ``median_tokens_per_verification``.

    Example:
        >>> summarize(rows)[0]["median_speedup_best_plain"]  # doctest: +SKIP
        1.21
    """
    key = lambda r: (r["temperature"], r["budget"], r["drafter"], str(r.get("tree_budget", "auto")))  # noqa: E731
    out = []
    for (temperature, budget, drafter, tree_budget), group in itertools.groupby(sorted(rows, key=key), key=key):
        group = list(group)
        kept = [r for r in group if not r.get("loops")]
        entry = {
            "temperature": temperature,
            "budget": budget,
            "drafter": drafter,
            "tree_budget": tree_budget,
            "prompts": len(kept),
            "left_out": [_name(r) for r in group if r.get("loops")],
        }
        if kept:
            entry.update(_medians(kept, greedy=temperature == 0))
        out.append(entry)
    return out


def _tokens_per_verification(row: dict[str, Any]) -> float:
    """Tokens one full-cache verification yielded in a row's TriForce call (its stats' ``mean_accepted_length``)."""
    return float(row["triforce"].get("triforce", {}).get("mean_accepted_length", 0.0))


def _medians(rows: list[dict[str, Any]], greedy: bool) -> dict[str, Any]:
    best = [r["plain_decodings"].get(r.get("best_plain"), r["plain"]) if r.get("plain_decodings") else r["plain"]
            for r in rows]  # fmt: skip
    out = {
        "median_speedup_best_plain": statistics.median(r.get("speedup_best_plain", r["speedup"]) for r in rows),
        "median_speedup_default": statistics.median(r["speedup"] for r in rows),
        "median_triforce_tokens_per_second": statistics.median(r["triforce"]["tokens_per_second"] for r in rows),
        "median_best_plain_tokens_per_second": statistics.median(b["tokens_per_second"] for b in best),
        "best_plain": [r.get("best_plain", "dynamic") for r in rows],
        "identical": sum(bool(r["identical_output"]) for r in rows) if greedy else None,
        "median_tokens_per_verification": statistics.median(_tokens_per_verification(r) for r in rows),
    }
    return out


def _name(row: dict[str, Any]) -> str:
    return (row.get("prompt") or {}).get("name", str(row["prompt_tokens"]))
