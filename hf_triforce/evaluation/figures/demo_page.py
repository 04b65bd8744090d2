"""The docs' table of an ``hf-triforce demo --output`` record: one row per temperature.

Example:
    >>> results = read_results("benchmarks/results/cpu-smollm2-demo-reference.json")  # doctest: +SKIP
    >>> write_demo(results, Path("/tmp"), "demo")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.formatting import number
from ..common.machine import device_line


def write_demo(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.md``: the device line, the document and question, and the table of :func:`demo_table`."""
    path = out / f"{stem}.md"
    path.write_text(demo_table(results))
    return [path]


def demo_table(results: dict[str, Any]) -> str:
    """Markdown: per temperature, new tokens, plain and TriForce decode speed, speedup, equality, and how much of
    the answer repeats itself (the fraction of its 8-token spans seen earlier in it)."""
    lines = [
        f"{device_line(results)} Document: {Path(results['document']).name} ({results['prompt_tokens']} prompt "
        f"tokens). Question: {results['question']}",
        "",
        "| T | new tokens plain / TriForce | plain tok/s | TriForce tok/s | speedup | identical | answer repeats |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in results["rows"]:
        plain, fast = row["plain"], row["triforce"]
        same = "n/a (sampling)" if row["temperature"] > 0 else ("yes" if row["identical_output"] else "**NO**")
        lines.append(
            f"| {row['temperature']:g} | {plain['new_tokens']} / {fast['new_tokens']} "
            f"| {number(plain['tokens_per_second'], 1)} | {number(fast['tokens_per_second'], 1)} "
            f"| {row['speedup']:.2f}x | {same} | {row['answer_repeated_fraction']:.0%} |"
        )
    return "\n".join(lines) + "\n"
