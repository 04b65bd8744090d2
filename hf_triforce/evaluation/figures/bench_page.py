"""The docs' page of an ``hf-triforce bench`` result: its tables, a decode-speed figure and a per-phase figure.

Example:
    >>> bench_tables(read_results("benchmarks/results/cpu-smollm2-7k.json"))[:7]  # doctest: +SKIP
    'Device:'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..bench.headline import headline_section
from ..common.divergence import identical_cell
from ..common.formatting import acceptances, phase_cell, phase_ms, tokens_per_second
from ..common.machine import device_line
from ..common.schedule_table import schedule_section
from .bench_plot import write_plot
from .pyplot import grouped_bars, pyplot, save

PHASES = (("level1", "level-1 step"), ("level2", "verification"), ("refresh", "refresh"), ("level0", "level-0 draft"))


def write_bench(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.md`` (tables), ``<stem>-speed.png`` and ``<stem>-phases.png`` for a bench result."""
    table = out / f"{stem}.md"
    headline = headline_section(results)
    table.write_text(_page(results, headline))
    written = [
        table,
        _bench_speed_png(results, out / f"{stem}-speed.png"),
        _bench_phase_png(results, out / f"{stem}-phases.png"),
    ]
    if headline:  # the prompt set: each prompt's ratio to best plain, per temperature
        written.append(_prompts_png(results, out / f"{stem}-prompts.png"))
    lengths = [r["prompt_tokens"] for r in results["rows"]]
    if max(lengths) > 1.1 * min(lengths):  # a sweep over context length (not prompts of about one length)
        written.append(write_plot(results, out / f"{stem}-context.png"))
    return written


def _page(results: dict[str, Any], headline: list[str]) -> str:
    """The tables, after the medians over prompts and the per-prompt table when the result has them."""
    if not headline:
        return bench_tables(results)
    rows = bench_tables(results).split("\n", 2)[2]  # without its device line, which the page opens with
    return "\n".join([device_line(results), "", *headline, "", "## Every row", "", rows])


def bench_tables(results: dict[str, Any]) -> str:
    """Markdown: the device line, one row per measured configuration, then milliseconds per phase."""
    lines = [
        device_line(results),
        "",
        "| prompt | T | drafter | budget | plain tok/s | plain + fast linears tok/s | TriForce tok/s | speedup "
        "| identical | level-0 acc. (round / per token) | level-1 acc. (round / per token) | "
        "tokens / full-cache forward |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in results["rows"]:
        t = r["triforce"]["triforce"]
        identical = identical_cell(r)
        lines.append(
            f"| {r['prompt_tokens']} | {r['temperature']} | {r['drafter']} | {r['budget']} | "
            f"{r['plain']['tokens_per_second']:.1f} | {tokens_per_second(r.get('plain_fast_linears'))} | "
            f"{r['triforce']['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {identical} | "
            f"{acceptances(t['levels']['level0'])} | {acceptances(t['levels']['level1'])} | "
            f"{t['mean_accepted_length']:.2f} |"
        )
    lines += ["", "| prompt | T | plain ms/token | " + " | ".join(f"{name} ms (calls)" for _, name in PHASES) + " |"]
    lines.append("|---:|---:|---:|" + "---:|" * len(PHASES))
    for r in results["rows"]:
        phases = r["triforce"]["triforce"]["phases"]
        cells = [phase_cell(phases.get(key)) for key, _ in PHASES]
        plain_ms = 1e3 * r["plain"]["decode_seconds_per_token"]
        lines.append(f"| {r['prompt_tokens']} | {r['temperature']} | {plain_ms:.1f} | " + " | ".join(cells) + " |")
    lines += schedule_section(results["rows"])
    return "\n".join(lines) + "\n"


def _bench_speed_png(results: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    rows = results["rows"]
    series = [
        ("plain generate()", [r["plain"]["tokens_per_second"] for r in rows]),
        ("plain + fast linears", [_tps_value(r.get("plain_fast_linears")) for r in rows]),
        ("TriForce", [r["triforce"]["tokens_per_second"] for r in rows]),
    ]
    if any(r.get("prompt_lookup") for r in rows):
        series.insert(2, ("transformers prompt lookup", [_tps_value(r.get("prompt_lookup")) for r in rows]))
    labels = [f"T={r['temperature']}, {r['prompt_tokens']} tokens\n{r['drafter']}, budget {r['budget']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    grouped_bars(ax, labels, series)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['speedup']:.2f}x", (i + 0.25, r["triforce"]["tokens_per_second"]), ha="center",
                    va="bottom", fontsize=9, fontweight="bold")  # fmt: skip
    ax.set(ylabel="decode tokens/s (prefill excluded)", title="Decode speed: plain generate() vs TriForce")
    return save(fig, ax, path, results)


def _prompts_png(results: dict[str, Any], path: Path) -> Path:
    """Per prompt: TriForce's decode speed over best plain's, one bar per temperature; looping answers marked."""
    plt = pyplot()
    rows = results["rows"]
    names = list(dict.fromkeys(r["prompt"]["name"] for r in rows))
    temperatures = sorted({r["temperature"] for r in rows})
    ratio = {(r["prompt"]["name"], r["temperature"]): r for r in rows}
    series = [(f"T={t:g}", [ratio[(n, t)]["speedup_best_plain"] if (n, t) in ratio else float("nan") for n in names])
              for t in temperatures]  # fmt: skip
    labels = [n + (" (loops)" if any(ratio.get((n, t), {}).get("loops") for t in temperatures) else "") for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    grouped_bars(ax, labels, series)
    ax.axhline(1.0, color="black", linewidth=0.8)
    title = "TriForce decode speed / best plain decoding, per prompt (1.0: as fast)"
    ax.set(ylabel="speedup vs best plain", title=title)
    return save(fig, ax, path, results)


def _bench_phase_png(results: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    rows = results["rows"]
    series = [
        ("plain step", [1e3 * r["plain"]["decode_seconds_per_token"] for r in rows]),
        ("plain + fast linears step", [1e3 / _tps_value(r.get("plain_fast_linears")) for r in rows]),
    ]
    for key, name in PHASES:
        series.append((name, [phase_ms(r["triforce"]["triforce"]["phases"].get(key), missing=0.0) for r in rows]))
    labels = [f"T={r['temperature']}, {r['prompt_tokens']} tokens" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    grouped_bars(ax, labels, series)
    ax.set(ylabel="milliseconds per call", title="Where the decode time goes")
    return save(fig, ax, path, results)


def _tps_value(run: dict[str, Any] | None) -> float:
    return float("nan") if run is None else run["tokens_per_second"]
