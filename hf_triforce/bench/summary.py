"""The bench's headline figures: medians over prompts against best plain, and each GPU figure beside its floor.

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
    ``prompts``; None when sampled), ``median_tokens_per_verification`` and, on a GPU of known bandwidth,
    ``median_fraction_of_floor``.

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
    fractions = [r["floor"]["triforce_fraction"] for r in rows if r.get("floor")]
    if fractions:
        out["median_fraction_of_floor"] = statistics.median(fractions)
    return out


def _name(row: dict[str, Any]) -> str:
    return (row.get("prompt") or {}).get("name", str(row["prompt_tokens"]))


def attach_floors(rows: list[dict[str, Any]], bandwidth: float | None) -> None:
    """Give each row its ``"floor"``: one plain step's bandwidth floor (weights + the whole prompt's KV read once,
    over the device's peak bandwidth) in ms, beside the plain and TriForce ms/token, and TriForce's ms/token as a
    fraction of it (below 1.0: faster than any plain decoding could be). Nothing on a device of unknown bandwidth
    (a CPU).

    Example:
        >>> attach_floors(rows, 3.35e12); rows[0]["floor"]["triforce_fraction"]  # doctest: +SKIP
        1.9
    """
    if not bandwidth:
        return
    for r in rows:
        per_token = r.get("kv_bytes_per_token")
        if per_token is None:
            continue
        floor_ms = 1e3 * (r["weight_bytes"] + r["prompt_tokens"] * per_token) / bandwidth
        triforce_ms = 1e3 * r["triforce"]["decode_seconds_per_token"]
        r["floor"] = {
            "plain_floor_ms": floor_ms,
            "triforce_ms": triforce_ms,
            "triforce_fraction": triforce_ms / floor_ms,
            "plain_ms": {name: 1e3 * d["decode_seconds_per_token"]
                         for name, d in (r.get("plain_decodings") or {}).items() if "error" not in d},
        }  # fmt: skip
