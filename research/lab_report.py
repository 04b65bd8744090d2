"""The lab bench's report sections beyond the product's (:func:`hf_triforce.bench.report.markdown_table`): the lab's
extra runs (repeated pairs, plain decoding with the CPU linear fast path, transformers' assisted generation), each
plain and TriForce ms/token against the plain floor, the planner's schedules, tensor-parallel ranks, measured steps
against their bandwidth floors with the speedup they model (with a real model's acceptance for a random-weights run),
and torch.profiler's operators per phase."""

from __future__ import annotations

from typing import Any

from hf_triforce.bench.bandwidth import PEAK_BANDWIDTH, modeled_speedup
from hf_triforce.bench.formatting import tokens_per_second
from hf_triforce.bench.headline import _plain_names
from hf_triforce.bench.report import markdown_table

from .batch import batch_table, modeled_batch_table
from .rank_report import rank_section
from .schedule_table import schedule_section


def device_bandwidth(device_name: str | None) -> float | None:
    """Peak bandwidth (bytes/s) of a known GPU by name, else ``None`` (no floor is reported)."""
    for key, value in PEAK_BANDWIDTH.items():
        if device_name and key.lower() in device_name.lower():
            return value
    return None


def phase_ms(phase: dict[str, Any] | None, missing: float = float("nan")) -> float:
    """Milliseconds per call of a phase (``TriForceStats.to_dict()["phases"][...]``), ``missing`` if it never ran.

    Example:
        >>> phase_ms({"calls": 4, "ms_per_call": 2.5}), phase_ms(None, missing=0.0)
        (2.5, 0.0)
    """
    return phase["ms_per_call"] if phase and phase["calls"] else missing


def lab_markdown(results: dict[str, Any]) -> str:
    """The product's page, then the lab's sections (or a batch run's tables)."""
    if "batch_rows" in results or "modeled_batch_rows" in results:
        head = markdown_table({**results, "rows": []}).split("\n## ")[0].rstrip("\n").splitlines()
        table = batch_table(results) if "batch_rows" in results else modeled_batch_table(results)
        return "\n".join(head + [""] + table) + "\n"
    lines = markdown_table(results).rstrip("\n").splitlines()
    lines += _extra_runs_section(results["rows"])
    lines += floor_section(results["rows"], _plain_names(results["rows"]))
    lines += rank_section(results)
    lines += schedule_section(results["rows"])
    lines += _bandwidth_section(results)
    lines += _profile_section(results["rows"])
    return "\n".join(lines) + "\n"


def _extra_runs_section(rows: list[dict[str, Any]]) -> list[str]:
    """The lab's extra runs of each row: plain ``generate()`` with hf_triforce's CPU linear fast path (how much of the
    speedup that path alone gives), transformers' assisted generation with the same draft model (the peer), and
    with ``--repeats N`` every interleaved pair's speedup (the row is the median pair)."""
    if not any(r.get(k) for r in rows for k in ("plain_fast_linears", "assisted_generation", "repeats")):
        return []
    lines = ["", "## The lab's extra runs", "", "| prompt tokens | T | plain + fast linears tok/s | assisted tok/s | "
             "repeated pairs' speedups |", "|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in rows:
        pairs = ", ".join(f"{p['speedup']:.2f}x" for p in r.get("repeats") or []) or "-"
        fast, assisted = (
            tokens_per_second(r.get("plain_fast_linears"), 2),
            tokens_per_second(r.get("assisted_generation"), 2),
        )
        lines.append(f"| {r['prompt_tokens']} | {r['temperature']:g} | {fast} | {assisted} | {pairs} |")
    return lines


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


def floor_section(rows: list[dict[str, Any]], names: list[str]) -> list[str]:
    """On a GPU of known bandwidth: every plain and TriForce ms/token beside one plain step's bandwidth floor."""
    floored = [r for r in rows if r.get("floor")]
    if not floored:
        return []
    header = ["prompt tokens", "T", "plain floor ms"] + [f"{n.replace('_', ' ')} ms" for n in names]
    header += ["TriForce ms", "TriForce / floor"]
    lines = ["", "## Against the plain decoding floor", "",
             "Floor = one plain step at its bandwidth limit: (weights + the whole prompt's KV) / peak bandwidth. "
             "TriForce / floor below 1.0 is faster than any plain decoding of the model could be.", "",
             "| " + " | ".join(header) + " |", "|" + "|".join(["---:"] * len(header)) + "|"]  # fmt: skip
    for r in floored:
        f = r["floor"]
        plain = [f"{f['plain_ms'][n]:.1f}" if n in f["plain_ms"] else "-" for n in names]
        cells = [str(r["prompt_tokens"]), f"{r['temperature']:g}", f"{f['plain_floor_ms']:.1f}", *plain]
        lines.append("| " + " | ".join([*cells, f"{f['triforce_ms']:.1f}", f"{f['triforce_fraction']:.2f}"]) + " |")
    return lines
