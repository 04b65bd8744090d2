"""Documentation figures and tables, generated from the recorded results in ``benchmarks/results/``.

``python -m hf_triforce.evaluation.figures.plots benchmarks/results docs/assets/plots`` (``make plots``) reads every
``*.json`` result file and writes, per file, PNG figures (matplotlib, Agg backend) and markdown table
snippets that the documentation includes, plus a copy of the JSON under ``data/`` so the site can link
to it. Three formats are understood: ``hf-triforce bench`` results (rows of plain vs TriForce),
``hf_triforce.evaluation.bench.tuning`` sweeps (rows with a ``knob``) and ``hf-triforce eval-drafts`` draft-quality
results (rendered by ``hf_triforce.evaluation.drafts.report``); other files are skipped with a warning.
Nothing is drawn by hand: regenerate after recording new results.

Example:
    >>> kind_of({"rows": [{"knob": "gamma2"}]}), kind_of({"rows": [{"speedup": 2.0, "plain": {}}]})
    ('tuning', 'bench')
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...stats import upgrade_stats_dicts

logger = logging.getLogger(__name__)

BUSY_LIMIT = 0.25  # cores a timed row lacked (taken by other processes) above which it is marked not comparable
PHASES = (("level1", "level-1 step"), ("level2", "verification"), ("refresh", "refresh"), ("level0", "level-0 draft"))


def kind_of(results: dict[str, Any]) -> str | None:
    """``"bench"``, ``"tuning"``, ``"eval-drafts"`` or ``None`` (a format this module does not plot)."""
    if isinstance(results, dict) and "views" in results and "options" in results:
        return "eval-drafts"
    rows = results.get("rows") if isinstance(results, dict) else None
    if not rows or not isinstance(rows, list):
        return None
    if "knob" in rows[0]:
        return "tuning"
    if "speedup" in rows[0] and "plain" in rows[0]:
        return "bench"
    return None


def device_line(results: dict[str, Any]) -> str:
    """One line naming the device and the library versions a result was measured with.

    Example:
        >>> m = {"cpu": "AMD EPYC", "torch_threads": 2, "cuda_device": None, "torch": "2.13.0+cpu",
        ...      "transformers": "5.23.0", "hf_triforce": "0.1.0", "python": "3.11.7", "date": "2026-11-23T00:21"}
        >>> device_line({"machine": m})[:60]
        'Device: AMD EPYC, 2 threads, no GPU. torch 2.13.0+cpu, trans'
    """
    m = results["machine"]
    threads = f"{m['torch_threads']} thread" + ("s" if m["torch_threads"] != 1 else "")
    device = m["cuda_device"] or f"{m['cpu']}, {threads}, no GPU"
    return (
        f"Device: {device}. torch {m['torch']}, transformers {m['transformers']}, hf_triforce {m['hf_triforce']}, "
        f"Python {m['python']}; {m['date'][:10]}."
    )


def generate_all(results_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the figures, tables and data copies of every result in ``results_dir``; returns the paths."""
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for path in sorted(Path(results_dir).glob("*.json")):
        results = upgrade_stats_dicts(json.loads(path.read_text()))
        kind = kind_of(results)
        if kind is None:
            logger.warning("skipping %s: not a bench or tuning result", path)
            continue
        writer = {"bench": write_bench, "tuning": write_tuning, "eval-drafts": write_eval_drafts}[kind]
        written += writer(results, out, path.stem)
        written.append(Path(shutil.copyfile(path, out / "data" / path.name)))
    return written


# ---------------------------------------------------------------------------------------------------
# hf-triforce bench results


def write_bench(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.md`` (tables), ``<stem>-speed.png`` and ``<stem>-phases.png`` for a bench result."""
    table = out / f"{stem}.md"
    table.write_text(bench_tables(results))
    return [
        table,
        _bench_speed_png(results, out / f"{stem}-speed.png"),
        _bench_phase_png(results, out / f"{stem}-phases.png"),
    ]


def bench_tables(results: dict[str, Any]) -> str:
    """Markdown: the device line, one row per measured configuration, then milliseconds per phase."""
    lines = [
        device_line(results),
        "",
        "| prompt | T | drafter | budget | plain tok/s | plain + fast linears tok/s | TriForce tok/s | speedup "
        "| identical | level-0 acc. | level-1 acc. | tokens / full-cache forward |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in results["rows"]:
        t = r["triforce"]["triforce"]
        identical = "yes" if r["identical_output"] else ("n/a (sampling)" if r["temperature"] > 0 else "NO")
        lines.append(
            f"| {r['prompt_tokens']} | {r['temperature']} | {r['drafter']} | {r['budget']} | "
            f"{r['plain']['tokens_per_second']:.1f} | {_tps(r.get('plain_fast_linears'))} | "
            f"{r['triforce']['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {identical} | "
            f"{_rate(t['levels']['level0'])} | {_rate(t['levels']['level1'])} | {t['mean_accepted_length']:.2f} |"
        )
    lines += ["", "| prompt | T | plain ms/token | " + " | ".join(f"{name} ms (calls)" for _, name in PHASES) + " |"]
    lines.append("|---:|---:|---:|" + "---:|" * len(PHASES))
    for r in results["rows"]:
        phases = r["triforce"]["triforce"]["phases"]
        cells = [_phase_cell(phases.get(key)) for key, _ in PHASES]
        plain_ms = 1e3 * r["plain"]["decode_seconds_per_token"]
        lines.append(f"| {r['prompt_tokens']} | {r['temperature']} | {plain_ms:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bench_speed_png(results: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = results["rows"]
    series = [
        ("plain generate()", [r["plain"]["tokens_per_second"] for r in rows]),
        ("plain + fast linears", [_tps_value(r.get("plain_fast_linears")) for r in rows]),
        ("TriForce", [r["triforce"]["tokens_per_second"] for r in rows]),
    ]
    labels = [f"T={r['temperature']}, {r['prompt_tokens']} tokens\n{r['drafter']}, budget {r['budget']}" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    _grouped_bars(ax, labels, series)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['speedup']:.2f}x", (i + 0.25, r["triforce"]["tokens_per_second"]), ha="center",
                    va="bottom", fontsize=9, fontweight="bold")  # fmt: skip
    ax.set(ylabel="decode tokens/s (prefill excluded)", title="Decode speed: plain generate() vs TriForce")
    return _save(fig, ax, path, results)


def _bench_phase_png(results: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    rows = results["rows"]
    series = [
        ("plain step", [1e3 * r["plain"]["decode_seconds_per_token"] for r in rows]),
        ("plain + fast linears step", [1e3 / _tps_value(r.get("plain_fast_linears")) for r in rows]),
    ]
    for key, name in PHASES:
        series.append((name, [_phase_ms(r["triforce"]["triforce"]["phases"].get(key)) for r in rows]))
    labels = [f"T={r['temperature']}, {r['prompt_tokens']} tokens" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    _grouped_bars(ax, labels, series)
    ax.set(ylabel="milliseconds per call", title="Where the decode time goes")
    return _save(fig, ax, path, results)


# ---------------------------------------------------------------------------------------------------
# hf_triforce.evaluation.bench.tuning sweeps


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
        level0 = "-" if r["level0_acceptance"] is None else f"{r['level0_acceptance']:.2f}"
        phases = r["triforce"]["phases"]
        lines.append(
            f"| {value} | {level0} | {r['level1_acceptance']:.2f} | {r['tokens_per_forward']:.2f} | "
            f"{_phase_ms(phases.get('level1')):.1f} | {_phase_ms(phases.get('level2')):.1f} | "
            f"{r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {'yes' if r['identical_output'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def _tuning_png(results: dict[str, Any], knob: str, rows: list[dict[str, Any]], path: Path) -> Path:
    plt = _pyplot()
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
    return _save(fig, None, path, results)


def _by_knob(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(r["knob"], []).append(r)
    return grouped


# ---------------------------------------------------------------------------------------------------
# hf-triforce eval-drafts results


def write_eval_drafts(results: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """``<stem>.md`` (the eval report, headings moved two levels down) and ``<stem>.png`` (its figure)."""
    from ..drafts.report import markdown_report, write_eval_plot

    table = out / f"{stem}.md"
    table.write_text(demote_headings(markdown_report(results), 2))
    return [table, Path(write_eval_plot(results, out / f"{stem}.png"))]


def demote_headings(markdown: str, levels: int) -> str:
    r"""Add ``levels`` ``#`` to every ATX heading outside code fences, so a page can be included in another.

    Example:
        >>> demote_headings("# Title\n```\n# code\n```\n## Part", 2)
        '### Title\n```\n# code\n```\n#### Part'
    """
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            line = "#" * levels + line
        lines.append(line)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# shared helpers


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grouped_bars(ax, labels: list[str], series: list[tuple[str, list[float]]]) -> None:
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        offsets = [i - 0.4 + width * (k + 0.5) for i in range(len(labels))]
        ax.bar(offsets, values, width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def _save(fig, ax, path: Path, results: dict[str, Any]) -> Path:
    if ax is not None:
        ax.legend(fontsize=7)
    fig.text(0.01, 0.005, device_line(results), fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _rate(level: dict[str, Any]) -> str:
    return f"{level['acceptance_rate']:.2f}" if level["drafted"] else "-"


def _tps(run: dict[str, Any] | None) -> str:
    return "-" if run is None else f"{run['tokens_per_second']:.1f}"


def _tps_value(run: dict[str, Any] | None) -> float:
    return float("nan") if run is None else run["tokens_per_second"]


def _phase_ms(phase: dict[str, Any] | None) -> float:
    return phase["ms_per_call"] if phase and phase["calls"] else 0.0


def _phase_cell(phase: dict[str, Any] | None) -> str:
    return "-" if not phase or not phase["calls"] else f"{phase['ms_per_call']:.1f} ({phase['calls']})"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hf_triforce.evaluation.figures.plots RESULTS_DIR OUT_DIR``."""
    parser = argparse.ArgumentParser(description="Figures and tables for the docs from recorded benchmark results.")
    parser.add_argument("results_dir", nargs="?", default="benchmarks/results")
    parser.add_argument("out_dir", nargs="?", default="docs/assets/plots")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for path in generate_all(args.results_dir, args.out_dir):
        logger.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
