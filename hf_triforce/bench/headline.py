"""The bench report's first section: the medians over prompts against best plain, then one row per prompt."""

from __future__ import annotations

from typing import Any

from .divergence import identical_cell
from .formatting import tokens_per_second

ROW_NOTE = (
    "Tokens per second of decoding (prefill excluded; {start}, forced to the same number of new tokens, the same "
    "penalty on the answer's own repetitions). Plain columns: "
    "`generate()` as a transformers user can configure it without speculation (dynamic: the default "
    "`DynamicCache`; static: `cache_implementation='static'`; static compiled: the static cache with "
    "`torch.compile` through `CompileConfig`; on CUDA also the sdpa flash backend, `flash_attention_2` and "
    "`generate_batch()`); best plain is the fastest of them, and 'vs best plain' is the headline ratio. Peers: "
    "transformers' own speculation, prompt lookup (`prompt_lookup_num_tokens`). "
    "'Loops': more than a quarter of the answer's 8-token spans occurred earlier in it; such a row is left out "
    "of the medians (n-gram drafting predicts a loop perfectly)."
)


def headline_section(results: dict[str, Any]) -> list[str]:
    """Markdown lines: the medians of ``results["summary"]``, then the per-prompt table (nothing for results
    recorded before the bench had summaries)."""
    summary = results.get("summary")
    if summary is None:
        return []
    lines = ["## Median over prompts, against the fastest plain decoding", ""]
    for s in summary:
        lines.append(_summary_line(s))
    rows = results["rows"]
    names = _plain_names(rows)
    header = ["prompt", "tokens", "T"] + [n.replace("_", " ") for n in names]
    header += ["best plain", "TriForce", "vs best plain", "vs default", "prompt lookup", "identical", "loops"]
    lines += ["", "## Per prompt (tokens/s)", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(["---", "---:", "---:"] + ["---:"] * (len(header) - 3)) + "|")
    lines += [_prompt_row(r, names) for r in rows]
    start = (
        "every run from a copy of the prompt's one prefill"
        if any("prefix_prefill_seconds" in r for r in rows)
        else ("every run a fresh call")
    )
    return lines + ["", ROW_NOTE.format(start=start)]


def _summary_line(s: dict[str, Any]) -> str:
    where = f"T={s['temperature']:g}, budget {s['budget']}, {s['drafter']}"
    trees = {"auto": ", tree budget auto", "0": ", chains"}
    if "tree_budget" in s:
        where += trees.get(str(s["tree_budget"]), f", trees of {s['tree_budget']} nodes")
    if not s["prompts"]:
        return f"- {where}: every answer looped ({', '.join(s['left_out'])}); no median."
    left = f"; left out (answers loop): {', '.join(s['left_out'])}" if s["left_out"] else ""
    same = "" if s.get("identical") is None else f"; identical text {s['identical']}/{s['prompts']}"
    plural = "s" if s["prompts"] != 1 else ""
    return (
        f"- {where}: **{s['median_speedup_best_plain']:.2f}x best plain** ({s['median_speedup_default']:.2f}x the "
        f"default), over {s['prompts']} prompt{plural} (TriForce {s['median_triforce_tokens_per_second']:.2f} tok/s, "
        f"best plain {s['median_best_plain_tokens_per_second']:.2f}{_per_verification(s)}){same}{left}."
    )


def _per_verification(s: dict[str, Any]) -> str:
    tokens = s.get("median_tokens_per_verification")
    return "" if tokens is None else f"; {tokens:.2f} tokens per verification"


def _plain_names(rows: list[dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for r in rows:
        names += [n for n in r.get("plain_decodings") or {} if n not in names]
    return names


def _decoding_cell(r: dict[str, Any], name: str) -> str:
    d = (r.get("plain_decodings") or {}).get(name)
    if d is None:
        return "-"
    if "error" in d:
        return "n/a" if d["error"].startswith("not run") else "failed"
    return f"{d['tokens_per_second']:.2f}"


def _prompt_row(r: dict[str, Any], names: list[str]) -> str:
    name = (r.get("prompt") or {}).get("name", "random ids")
    best = r.get("best_plain", "dynamic")
    cells = [name, str(r["prompt_tokens"]), f"{r['temperature']:g}"] + [_decoding_cell(r, n) for n in names]
    cells += [best.replace("_", " "), f"{r['triforce']['tokens_per_second']:.2f}"]
    cells += [f"{r.get('speedup_best_plain', r['speedup']):.2f}x", f"{r['speedup']:.2f}x"]
    cells += [tokens_per_second(r.get("prompt_lookup"), 2)]
    cells.append(identical_cell(r))
    cells.append(_loops_cell(r))
    return "| " + " | ".join(cells) + " |"


def _loops_cell(r: dict[str, Any]) -> str:
    if "loops" not in r:
        return "-"
    fraction = f"{r['answer_repeated_fraction']:.0%}"
    return f"**loops** ({fraction})" if r["loops"] else f"no ({fraction})"
