"""The bench report's table of end-to-end times, prompt-lookup decoding and the adaptive schedule's rounds."""

from __future__ import annotations

from typing import Any

from hf_triforce.bench.formatting import acceptances, tokens_per_second


def schedule_section(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: end to end (prefill included), transformers' prompt lookup on the same prompt, and the rounds
    the adaptive schedule chose, one row per bench row (rows recorded before these were measured are left out).

    Example:
        >>> schedule_section([{"plain": {}}])  # recorded before end-to-end times
        []
    """
    rows = [r for r in rows if "end_to_end_seconds" in r["plain"]]
    if not rows:
        return []
    lines = [
        "",
        "## End to end, prompt lookup and the schedule",
        "",
        "End to end = prefill + decoding of one call, in seconds"
        + (PREFIX_NOTE if any("prefix_prefill_seconds" in r for r in rows) else "")
        + ". Prompt lookup is transformers' "
        "`prompt_lookup_num_tokens` on the same prompt (`--prompt-lookup N`). Rounds: how many rounds the schedule "
        "ran as level 0 -> 1 -> 2, level 0 -> 2 and plain one-token steps (`TriForceConfig.adaptive`).",
        "",
        "| prompt | T | drafter | plain s | TriForce s | prompt-lookup tok/s | TriForce / prompt lookup | "
        "rounds 0->1->2 / 0->2 / plain | level-0 -> level-2 acc. (round / per token) |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|",
    ]
    return lines + [schedule_row(r) for r in rows]


PREFIX_NOTE = (
    " (timed from a copy of the prompt's one prefill: the prefill here is the prompt's last token only, the one "
    "prefill is in the JSON's `prefix_prefill_seconds`)"
)


def schedule_row(r: dict[str, Any]) -> str:
    """One bench row of :func:`schedule_section`."""
    t, lookup = r["triforce"], r.get("prompt_lookup")
    rounds = t["triforce"].get("rounds", {})
    ratio = None if lookup is None else t["tokens_per_second"] / lookup["tokens_per_second"]
    counts = " / ".join(str(rounds.get(k, 0)) for k in ("levels", "level0", "plain"))
    direct = t["triforce"]["levels"].get("level0_to_level2")
    return (
        f"| {r['prompt_tokens']} | {r['temperature']} | {r['drafter']} | {r['plain']['end_to_end_seconds']:.1f} | "
        f"{t['end_to_end_seconds']:.1f} | {tokens_per_second(lookup, 2)} | "
        f"{'-' if ratio is None else f'{ratio:.2f}x'} | {counts} | {acceptances(direct) if direct else '-'} |"
    )
