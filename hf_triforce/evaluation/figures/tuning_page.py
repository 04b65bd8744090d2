"""The docs' pages of a tuning sweep (``hf_triforce.evaluation.bench.tuning``): per knob, a table and a figure.

Example:
    >>> write_tuning(read_results("benchmarks/results/cpu-smollm2-tuning.json"), Path("/tmp"), "t")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.formatting import number, phase_ms
from ..common.machine import device_line
from .pyplot import pyplot, save

BUSY_LIMIT = 0.25  # cores a timed row lacked (taken by other processes) above which it is marked not comparable


def write_tuning(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """Per knob: ``<stem>-<knob>.md`` (table) and ``<stem>-<knob>.png``; plus ``<stem>.md`` (setup line)."""
    header = out / f"{stem}.md"
    header.write_text(tuning_header(results))
    written = [header]
    for knob, rows in _by_knob(results["rows"]).items():
        table = out / f"{stem}-{knob}.md"
        table.write_text(tuning_table(results, knob, rows))
        written += [table, _tuning_png(results, knob, rows, out / f"{stem}-{knob}.png")]
    return written


def tuning_header(results: dict[str, Any]) -> str:
    """Markdown: device, prompt, baseline and the plain reference of a tuning sweep."""
    end = results.get("plain_at_end")
    drift = "" if end is None else f" ({end['tokens_per_second']:.1f} tok/s when measured again after the sweep)"
    return (
        f"{device_line(results)} Prompt: {results['prompt_tokens']} tokens (the Python reference + a question), "
        f"{results['new_tokens']} new tokens, greedy. Baseline: {_baseline_knobs(results)}; every table changes one of "
        "them. Plain generate(): "
        f"{results['plain']['tokens_per_second']:.1f} tok/s{drift}. Rows marked † ran while other processes took "
        f"more than {BUSY_LIMIT} of the cores its threads needed: their speed is not comparable.\n"
    )


def _baseline_knobs(results: dict[str, Any]) -> str:
    """``knob=value`` of the baseline for every knob the sweep varies, in sweep order."""
    base = results["baseline"]
    knobs = dict.fromkeys(["retrieval_budget", "drafter", *(r["knob"] for r in results["rows"])])
    return ", ".join(f"{k}={base[k]!r}" for k in knobs)


def tuning_table(results: dict[str, Any], knob: str, rows: list[dict[str, Any]]) -> str:
    """Markdown table of one knob's rows: acceptance per level, tokens per forward, speed, equality."""
    baseline = results["baseline"][knob]
    lines = [
        f"| {knob} | level-0 acc. | level-1 acc. | tokens / full-cache forward | level-1 step ms | verification ms "
        "| TriForce tok/s | speedup | identical |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        value = f"**{r['value']}** (baseline)" if r["value"] == baseline else str(r["value"])
        value += " †" if (r.get("cores_lacked") or 0.0) > BUSY_LIMIT else ""
        level0 = number(r["level0_acceptance"], 2)
        phases = r["triforce"]["phases"]
        lines.append(
            f"| {value} | {level0} | {r['level1_acceptance']:.2f} | {r['tokens_per_forward']:.2f} | "
            f"{phase_ms(phases.get('level1'), missing=0.0):.1f} | "
            f"{phase_ms(phases.get('level2'), missing=0.0):.1f} | "
            f"{r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {'yes' if r['identical_output'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def _tuning_png(results: dict[str, Any], knob: str, rows: list[dict[str, Any]], path: Path) -> Path:
    plt = pyplot()
    x = list(range(len(rows)))
    fig, (acc, speed) = plt.subplots(1, 2, figsize=(9, 3.4))
    acc.plot(x, [r["level1_acceptance"] for r in rows], marker="o", label="level-1 (retrieval) acceptance")
    level0 = [float("nan") if r["level0_acceptance"] is None else r["level0_acceptance"] for r in rows]
    acc.plot(x, level0, marker="s", linestyle="--", label="level-0 acceptance")
    acc.set(ylim=(0, 1.05), ylabel="acceptance (accepted / drafted)", title=f"Acceptance vs {knob}")
    speed.bar(x, [r["speedup"] for r in rows], color="tab:green", label="speedup over plain generate()")
    speed.axhline(1.0, color="gray", linewidth=0.8)
    for i, r in enumerate(rows):
        speed.annotate(
            f"{r['tokens_per_forward']:.1f} tok/fwd", (i, r["speedup"]), ha="center", va="bottom", fontsize=8
        )
    speed.set(ylabel="speedup (decode)", title=f"Speedup vs {knob}", ylim=(0, 1.18 * max(r["speedup"] for r in rows)))
    for ax in (acc, speed):
        ax.set_xticks(x, [str(r["value"]) for r in rows])
        ax.set_xlabel(knob)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return save(fig, None, path, results)


def _by_knob(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(r["knob"], []).append(r)
    return grouped
