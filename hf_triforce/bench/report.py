"""The benchmark's results: written as JSON, and as a markdown page of tables (``hf-triforce bench``'s report)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .bandwidth import device_bandwidth, modeled_speedup
from .batch import batch_table, modeled_batch_table
from .divergence import identical_cell
from .formatting import acceptances, mib, number, phase_cell, phase_ms, tokens_per_second
from .headline import headline_section
from .machine import device_name, library_versions
from .rank_report import rank_section
from .results import write_json
from .schedule_table import schedule_section


def write_results(results: dict[str, Any], path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``results`` as JSON and its ``"rows"`` as a markdown table beside it; returns both paths.

    Example:
        >>> write_results(run_benchmark(BenchOptions()), "benchmarks/results/cpu.json")  # doctest: +SKIP
        (PosixPath('benchmarks/results/cpu.json'), PosixPath('benchmarks/results/cpu.md'))
    """
    path = write_json(results, path)
    md = path.with_suffix(".md")
    md.write_text(markdown_table(results))
    return path, md


def markdown_table(results: dict[str, Any]) -> str:
    """A markdown page: the machine, then one table row per measured configuration (and per rank with ``--tp``)."""
    m = results["machine"]
    lines = [
        f"# {results['title']}",
        "",
        f"Device: {device_name(m)}. {library_versions(m)}, Python {m['python']}; {m['date']}.",
        "",
        f"Command: `{results['command']}`",
        "",
    ]
    if "batch_rows" in results:
        return "\n".join(lines + batch_table(results)) + "\n"
    if "modeled_batch_rows" in results:
        return "\n".join(lines + modeled_batch_table(results)) + "\n"
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
        "level-0 acc. (round / per token) | level-1 acc. (round / per token) | tokens/forward | "
        "plain + fast linears tok/s |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    lines += [_row(r) for r in results["rows"]]
    lines += [
        "",
        "Speedup = plain decode latency per token / TriForce's, same process and prompt, prefill excluded, after "
        "warm-up; both forced to the same number of new tokens. The last column is plain generate() with "
        "hf_triforce's CPU linear fast path (hf_triforce.kernels.linear) switched on: it shows how much of the "
        "speedup that path alone would give; the rest comes from speculation. Identical: greedy token ids equal "
        "plain generate()'s; \"near-tie at N\": they first differ at new token N, where both runs' top-2 logits "
        "are closer than twice the largest logits difference of the two runs over the tokens before N and than 16 "
        "units in the last place of the model's dtype (bf16 rounding of a one-token forward against a multi-token "
        'one; hf_triforce.bench.divergence); "NO at N": a real divergence.',
    ]
    lines += _repeats_note(results["rows"])
    lines += rank_section(results)
    lines += schedule_section(results["rows"])
    lines += _phase_section(results["rows"])
    lines += _bandwidth_section(results)
    lines += _profile_section(results["rows"])
    return "\n".join(lines) + "\n"


def _repeats_note(rows: list[dict[str, Any]]) -> list[str]:
    """With ``--repeats N``: each row is the median of N interleaved (plain, TriForce) pairs; their speedups."""
    repeated = [r for r in rows if r.get("repeats")]
    if not repeated:
        return []
    lines = ["", f"Each row is the pair of median speedup among {len(repeated[0]['repeats'])} interleaved (plain, "
             "TriForce) pairs (`--repeats`; sampled pairs with seeds seed, seed + 1, ...: each pair is its own "
             "text); every pair's speedup:", ""]  # fmt: skip
    for r in repeated:
        speedups = ", ".join(f"{p['speedup']:.2f}x" for p in r["repeats"])
        lines.append(f"- {r['prompt_tokens']} tokens, T={r['temperature']}: {speedups}")
    return lines


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
        "Bytes read per forward (bandwidth model, DESIGN.md section 5): weights + the KV it attends to.",
        "",
        "| prompt | T | plain ms/token | plain + fast linears ms/token | level-1 step | verification | "
        "refresh | level-0 draft | weights | full KV | view KV | peak memory plain / TriForce |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [_phase_row(r) for r in rows]


def _phase_row(r: dict[str, Any]) -> str:
    t = r["triforce"]["triforce"]
    fast = r.get("plain_fast_linears")
    fast_ms = number(None if fast is None else 1000 * fast["decode_seconds_per_token"], 1)
    phases = [phase_cell(t["phases"].get(name)) for name in ("level1", "level2", "refresh", "level0")]
    sizes = [mib(r.get("weight_bytes"), 0), mib(t["full_cache_bytes"], 0), mib(t["view_bytes"], 0)]
    return (
        f"| {r['prompt_tokens']} | {r['temperature']} | {1000 * r['plain']['decode_seconds_per_token']:.1f} | "
        f"{fast_ms} | " + " | ".join([*phases, *sizes, _peak(r)]) + " |"
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
        f"{acceptances(levels['level1'])} | {t['mean_accepted_length']:.2f} | "
        f"{tokens_per_second(r.get('plain_fast_linears'), 2)} |"
    )


def _profile_section(rows: list[dict[str, Any]]) -> list[str]:
    """Operators taking the most self time in each phase, from ``--profile`` (torch.profiler) runs."""
    lines = []
    for r in rows:
        if "profile" not in r:
            continue
        title = f"### Operators per phase (torch.profiler): prompt {r['prompt_tokens']}, T={r['temperature']}"
        lines += ["", title, ""]
        lines += ["| phase | calls | ms/call | top operators (self ms/call) |", "|---|---:|---:|---|"]
        for phase, p in r["profile"].items():
            ops = ", ".join(f"{name.removeprefix('aten::')} {ms:.1f}" for name, ms in p["ops"].items())
            lines.append(f"| {phase} | {p['calls']} | {p['ms_per_call']:.1f} | {ops} |")
    if lines:
        lines += ["", "Profiled calls run with the profiler's overhead; the tables above are the timed figures."]
    return lines


def _bandwidth_section(results: dict[str, Any]) -> list[str]:
    """Measured step latencies next to the bandwidth floor (GPU only) and the speedup they model."""
    bandwidth = device_bandwidth(results["machine"]["cuda_device"])
    lines = [
        "",
        "## Against the bandwidth model",
        "",
        "Floor = (weights + attended KV) / peak bandwidth (level 1's weights: its int8 or int4 copy where it drafts "
        "with one; a verification's floor is a plain step's: it reads the weights and the whole cache once, whatever "
        "its width)"
        + (f" ({bandwidth / 1e12:.2f} TB/s)." if bandwidth else " (no peak bandwidth known for a CPU: floors omitted).")
        + " Modeled speedup = expected tokens per verification x plain step / (gamma2 level-1 steps + one "
        "verification), from this run's measured latencies (hf_triforce.bench.bandwidth; level 0 not "
        "modeled), with this run's level-1 per-token acceptance, and with the acceptance of a real model on real "
        "text (in brackets); the last but one column is the ms per token that real-text acceptance models, and its "
        "fraction of the plain floor (below 1.0: faster than any plain decoding of the model could be). "
        "With random weights (a shape preset) only the real-text columns mean anything, and the measured speedup is "
        "that of random-weights drafts.",
        "",
        "| prompt | T | plain step ms (floor) | level-1 step ms (floor) | verification ms (floor) | "
        "verification / plain step | modeled, this run's acceptance | modeled, real-text acceptance | "
        "modeled ms/token, real text (x plain floor) | measured speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_bandwidth_row(r, bandwidth) for r in results["rows"]]
    sources = sorted({r["real_acceptance"]["source"] for r in results["rows"] if r.get("real_acceptance")})
    return lines + (["", "Real-text acceptance: " + "; ".join(sources) + "."] if sources else [])


def _bandwidth_row(r: dict[str, Any], bandwidth: float | None) -> str:
    t = r["triforce"]["triforce"]
    plain_ms = 1e3 * r["plain"]["decode_seconds_per_token"]
    level1_ms, verify_ms = phase_ms(t["phases"].get("level1")), phase_ms(t["phases"].get("level2"))
    floors = _floors(r, bandwidth)
    modeled = modeled_speedups(r)
    real = modeled["real_text_acceptance"]
    real_text = "-" if real is None else f"{real:.2f}x ({r['real_acceptance']['level1']:.3f})"
    verification = f"{verify_ms:.1f} ({floors[0]})"
    modeled_ms = _modeled_ms_per_token(plain_ms, real, floors[0])
    return (
        f"| {r['prompt_tokens']} | {r['temperature']} | {plain_ms:.1f} ({floors[0]}) | {level1_ms:.1f} ({floors[1]}) | "
        f"{verification} | {verify_ms / plain_ms:.2f} | {modeled['this_run_acceptance']:.2f}x | {real_text} | "
        f"{modeled_ms} | {r['speedup']:.2f}x |"
    )


def _modeled_ms_per_token(plain_ms: float, speedup: float | None, plain_floor: str) -> str:
    """``"ms (x floor)"``: the ms per token a modeled ``speedup`` over a ``plain_ms`` step means, and its fraction of
    the plain floor (``"-"`` where there is none).

    Example:
        >>> _modeled_ms_per_token(60.0, 3.0, "10.0"), _modeled_ms_per_token(60.0, 3.0, "-")
        ('20.0 (2.00x)', '20.0')
    """
    if speedup is None:
        return "-"
    ms = plain_ms / speedup
    return f"{ms:.1f}" if plain_floor == "-" else f"{ms:.1f} ({ms / float(plain_floor):.2f}x)"


def modeled_speedups(r: dict[str, Any]) -> dict[str, float | None]:
    """Speedups the bandwidth model predicts from a row's measured step latencies (level 0 not modeled).

    ``this_run_acceptance`` uses the row's own level-1 per-token acceptance (meaningless with random weights; the
    round rate for rows recorded before it existed): the model's ``expected_tokens`` takes a per-token
    probability, which the round rate ``accepted / drafted`` underestimates. ``real_text_acceptance`` uses
    ``r["real_acceptance"]`` (a real model on real text, per position), or is ``None``.
    """
    t = r["triforce"]["triforce"]
    plain_ms = 1e3 * r["plain"]["decode_seconds_per_token"]
    latencies = (plain_ms, phase_ms(t["phases"].get("level1")), phase_ms(t["phases"].get("level2")))
    gamma2 = r["config"]["gamma2"]
    level1 = t["levels"]["level1"]
    own = modeled_speedup(*latencies, level1.get("per_token_acceptance", level1["acceptance_rate"]), gamma2)
    real = r.get("real_acceptance")
    return {
        "this_run_acceptance": own,
        "real_text_acceptance": None if real is None else modeled_speedup(*latencies, real["level1"], gamma2),
    }


def _floors(r: dict[str, Any], bandwidth: float | None) -> tuple[str, str]:
    per_token = r.get("kv_bytes_per_token")
    if not bandwidth or per_token is None:
        return "-", "-"
    plain, level1 = r["weight_bytes"], r.get("level1_weight_bytes", r["weight_bytes"])  # level 1 may read a copy
    view = r["config"]["retrieval_budget"]
    pairs = ((plain, r["prompt_tokens"]), (level1, view))
    return tuple(f"{1e3 * (weights + n * per_token) / bandwidth:.1f}" for weights, n in pairs)
