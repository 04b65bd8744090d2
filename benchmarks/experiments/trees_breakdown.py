"""Issue 53: chains against token trees in ``hf-triforce bench --tree-budgets`` records, and what bounds the speed.

For each row: best plain and TriForce tokens/s, tokens per full-cache verification, the rounds drafted as trees,
level 1's per-token acceptance. Then, per (temperature, tree budget), the medians over prompts of each phase as ms
per call and per generated token beside one step of the fastest plain decoding, and the *ceiling*: the speedup a
round would reach if level 1 were accepted at every position of a ``gamma2``-long chain (``gamma2 + 1`` tokens for
one verification, ``gamma2`` level-1 forwards and the measured refreshes per round), at the measured costs.

Run: ``.venv/bin/python benchmarks/experiments/trees_breakdown.py
benchmarks/results/token-trees-7k/cpu-smollm2-7k-trees.json``
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

GAMMA2 = 6  # TriForceConfig's default


def best_plain_ms(row: dict) -> float:
    """One step of the fastest plain decoding of the row, in ms."""
    return 1e3 / row["plain_decodings"][row["best_plain"]]["tokens_per_second"]


def phase(stats: dict, name: str) -> tuple[float, int]:
    """(seconds, calls) of one phase of a TriForce call's stats."""
    entry = stats["phases"].get(name) or {}
    return entry.get("seconds", 0.0), entry.get("calls", 0)


def per_row(row: dict) -> str:
    stats = row["triforce"]["triforce"]
    identical = "yes" if row["identical_output"] else ("n/a" if row["temperature"] else "NO")
    return (
        f"| {row['prompt']['name']} | {row['prompt_tokens']} | {row['temperature']:g} | {row['tree_budget']} | "
        f"{1e3 / best_plain_ms(row):.2f} | {row['triforce']['tokens_per_second']:.2f} | "
        f"{row['speedup_best_plain']:.2f}x | "
        f"{stats['mean_accepted_length']:.2f} | {stats['tree_rounds']} / {stats['target_forwards']} | "
        f"{stats['levels']['level1']['per_token_acceptance']:.3f} | {identical} |"
    )


def breakdown(rows: list[dict]) -> dict[str, float]:
    """Medians over ``rows`` (one temperature and tree budget) of each phase's cost."""
    out: dict[str, list[float]] = {}
    for row in rows:
        stats, tokens = row["triforce"]["triforce"], row["triforce"]["triforce"]["new_tokens"]
        rounds = max(stats["target_forwards"], 1)
        values = {"plain step": best_plain_ms(row), "total": 1e3 / row["triforce"]["tokens_per_second"]}
        for name in ("level0", "level1", "refresh", "level2"):
            seconds, calls = phase(stats, name)
            values[f"{name}/token"] = 1e3 * seconds / tokens
            values[f"{name}/call"] = 1e3 * seconds / calls if calls else 0.0
            values[f"{name}/round"] = 1e3 * seconds / rounds
        ideal = values["level2/call"] + GAMMA2 * values["level1/call"] + values["refresh/round"]
        values["ceiling"] = (GAMMA2 + 1) * values["plain step"] / ideal
        for key, value in values.items():
            out.setdefault(key, []).append(value)
    return {key: statistics.median(vals) for key, vals in out.items()}


def report(paths: list[str]) -> str:
    rows = [row for path in paths for row in json.loads(Path(path).read_text())["rows"]]
    lines = [
        "| prompt | tokens | T | tree budget | best plain tok/s | TriForce tok/s | vs best plain "
        "| tokens / verification | tree rounds / verifications | level-1 per-token acceptance | identical |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [per_row(row) for row in rows]
    lines += [
        "",
        "Median over prompts; ms per call (ms per generated token):",
        "",
        "| T | tree budget | best-plain step | verification | level-1 forward | refresh | level 0 | TriForce per token "
        f"| ceiling (every level-1 token accepted, gamma2={GAMMA2}) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[float, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["temperature"], str(row["tree_budget"])), []).append(row)
    for (temperature, budget), group in sorted(groups.items()):
        b = breakdown(group)
        cells = [f"{b[f'{n}/call']:.1f} ({b[f'{n}/token']:.1f})" for n in ("level2", "level1", "refresh", "level0")]
        lines.append(
            f"| {temperature:g} | {budget} | {b['plain step']:.1f} | " + " | ".join(cells) + f" | {b['total']:.1f} "
            f"| {b['ceiling']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="hf-triforce bench JSON records")
    print(report(parser.parse_args().records))


if __name__ == "__main__":
    main()
