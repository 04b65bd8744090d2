"""The benchmark's results: written as JSON, and as a markdown page of tables (``hf-triforce bench``'s report)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .divergence import identical_cell
from .formatting import acceptances, mib, phase_cell
from .headline import headline_section
from .machine import device_name, library_versions
from .results import write_json


def write_results(
    results: dict[str, Any], path: str | os.PathLike[str], markdown: Callable[[dict[str, Any]], str] | None = None
) -> tuple[Path, Path]:
    """Write ``results`` as JSON and its page (``markdown``, by default :func:`markdown_table`) beside it; returns
    both paths.

    Example:
        >>> write_results(run_benchmark(BenchOptions()), "results/cpu.json")  # doctest: +SKIP
        (PosixPath('results/cpu.json'), PosixPath('results/cpu.md'))
    """
    path = write_json(results, path)
    md = path.with_suffix(".md")
    md.write_text((markdown or markdown_table)(results))
    return path, md


def markdown_table(results: dict[str, Any]) -> str:
    """A markdown page: the machine, the medians over prompts, then one table row per measured configuration."""
    m = results["machine"]
    lines = [
        f"# {results['title']}",
        "",
        f"Device: {device_name(m)}. {library_versions(m)}, Python {m['python']}; {m['date']}.",
        "",
        f"Command: `{results['command']}`",
        "",
    ]
    lines += headline_section(results)
    lines += [
        "",
        "## Every row",
        "",
        "Against `generate()`'s defaults (`DynamicCache`), with the drafts' acceptance.",
        "",
    ]
    lines += [
        "| prompt | T | drafter | budget | plain tok/s | TriForce tok/s | speedup | identical | "
        "level-0 acc. (round / per token) | level-1 acc. (round / per token) | tokens/forward |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    lines += [_row(r) for r in results["rows"]]
    lines += [
        "",
        "Speedup = plain decode latency per token / TriForce's, same process and prompt, prefill excluded, after "
        "warm-up; both forced to the same number of new tokens. Identical: greedy token ids equal "
        "plain generate()'s; \"near-tie at N\": they first differ at new token N, where both runs' top-2 logits "
        "are closer than twice the largest logits difference of the two runs over the tokens before N and than 16 "
        "units in the last place of the model's dtype (bf16 rounding of a one-token forward against a multi-token "
        'one; hf_triforce.bench.divergence); "NO at N": a real divergence.',
    ]
    lines += _phase_section(results["rows"])
    return "\n".join(lines) + "\n"


def _phase_section(rows: list[dict[str, Any]]) -> list[str]:
    """Where the decode time goes: milliseconds per call of each TriForce phase, next to the bytes read."""
    lines = [
        "",
        "## Where the time goes",
        "",
        "Milliseconds per call, the mean (calls in brackets, and the median where a few slow calls lift the mean "
        "above 1.5 times it: a kernel compiled or a graph captured inside the timed call). "
        "A level-1 step runs the target over the retrieval view "
        "(1 + level-0 drafts tokens); a verification runs it over the full cache (gamma2 + 1 tokens). "
        "Bytes read per forward (the bandwidth model, hf_triforce.bench.bandwidth): weights + the KV it attends to.",
        "",
        "| prompt | T | plain ms/token | level-1 step | verification | refresh | level-0 draft | weights | full KV | "
        "view KV | peak memory plain / TriForce |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [_phase_row(r) for r in rows]


def _phase_row(r: dict[str, Any]) -> str:
    t = r["triforce"]["triforce"]
    phases = [phase_cell(t["phases"].get(name)) for name in ("level1", "level2", "refresh", "level0")]
    sizes = [mib(r.get("weight_bytes"), 0), mib(t["full_cache_bytes"], 0), mib(t["view_bytes"], 0)]
    return (
        f"| {r['prompt_tokens']} | {r['temperature']} | {1000 * r['plain']['decode_seconds_per_token']:.1f} | "
        + " | ".join([*phases, *sizes, _peak(r)])
        + " |"
    )


def _peak(r: dict[str, Any]) -> str:
    """GPU peak allocated memory of each run, or the process's peak RSS (both runs together) on the CPU."""
    plain, triforce = r["plain"].get("peak_gpu_bytes"), r["triforce"].get("peak_gpu_bytes")
    if plain is not None and triforce is not None:
        return f"{plain / 2**30:.1f} / {triforce / 2**30:.1f} GiB (GPU)"
    rss = r.get("peak_rss_bytes")
    return "-" if rss is None else f"{rss / 2**30:.1f} GiB (process RSS)"


def _row(r: dict[str, Any]) -> str:
    t = r["triforce"]["triforce"]
    levels = t["levels"]
    identical = identical_cell(r)
    return (
        f"| {r['prompt_tokens']} | {r['temperature']} | {r['drafter']} | {r['budget']} | "
        f"{r['plain']['tokens_per_second']:.2f} | {r['triforce']['tokens_per_second']:.2f} | "
        f"{r['speedup']:.2f}x | {identical} | {acceptances(levels['level0'])} | "
        f"{acceptances(levels['level1'])} | {t['mean_accepted_length']:.2f} |"
    )
